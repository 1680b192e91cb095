"""The Qwen-VL video processors' arithmetic without torchvision (workers/engine/models/video_frames.py), against
transformers' own Qwen2-VL image processor, which lays a picture out as a video of that picture twice."""
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from workers.engine.models.video_frames import QwenVideoFrames

from . import media_files


@pytest.mark.parametrize("size", [(48, 40), (200, 64), (20, 30)])
def test_a_video_of_one_picture_twice_is_laid_out_as_the_image_processor_lays_out_the_picture(size):
    picture = media_files.image(3, size)
    image_processor = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                               min_pixels=16 * 16, max_pixels=48 * 48)
    video_processor = QwenVideoFrames("Qwen2VLVideoProcessor", {
        "patch_size": 4, "merge_size": 2, "temporal_patch_size": 2,
        "size": {"shortest_edge": 16 * 16, "longest_edge": 48 * 48},
        "image_mean": list(image_processor.image_mean), "image_std": list(image_processor.image_std)})
    image = image_processor(images=[picture], return_tensors="pt")
    video = video_processor([[picture, picture]])
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist()
    assert torch.allclose(video["pixel_values_videos"], image["pixel_values"], atol=1e-5)


def test_qwen3_vl_weighs_every_frame_and_an_odd_last_frame_repeats():
    frames = [media_files.image(seed, (64, 64)) for seed in range(3)]
    processor = QwenVideoFrames("Qwen3VLVideoProcessor", {"patch_size": 4, "merge_size": 2,
                                                          "size": {"shortest_edge": 64, "longest_edge": 4 * 32 * 32}})
    out = processor([frames])
    # 3 frames count as 4 (whole temporal patches): 4 x 64 x 64 > 4 x 32 x 32, so each side halves to 32
    assert out["video_grid_thw"].tolist() == [[2, 8, 8]]
    last = out["pixel_values_videos"].view(2, 64, 3, 2, 16)[1, :, :, 1]  # the second pair's second frame
    assert torch.equal(last, out["pixel_values_videos"].view(2, 64, 3, 2, 16)[1, :, :, 0])
    with pytest.raises(ValueError, match="at least 2 frames"):
        processor([frames[:1]])
