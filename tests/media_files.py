"""Media files generated for the tests (numpy, PIL, wave, PyAV): nothing is downloaded."""
from __future__ import annotations

import base64
import io
import wave

import numpy as np
from PIL import Image


def image(seed: int, size: tuple[int, int] = (48, 40)) -> Image.Image:
    pixels = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png_bytes(picture: Image.Image) -> bytes:
    out = io.BytesIO()
    picture.save(out, format="PNG")
    return out.getvalue()


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def tone(seconds: float, frequency: float, rate: int = 16000) -> np.ndarray:
    """A sine tone with a little seeded noise, float32 in [-1, 1]."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.RandomState(int(frequency)).randn(t.size) * 0.01
    return (0.3 * np.sin(2 * np.pi * frequency * t) + noise).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def mp3_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray((np.clip(samples, -1, 1) * 32767).astype(np.int16)[None, :],
                                           format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def video_frames(count: int, size: tuple[int, int] = (32, 32)) -> list[Image.Image]:
    return [image(100 + i, size) for i in range(count)]


def lossless_video_bytes(frames: list[Image.Image], fps: int = 4, sound: np.ndarray | None = None,
                         rate: int = 16000) -> bytes:
    """Frames in a Matroska file with the lossless FFV1 codec: decoding gives the exact pixels back; with
    `sound`, a mono 16-bit PCM track beside them."""
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "bgr0"
        track = container.add_stream("pcm_s16le", rate=rate, layout="mono") if sound is not None else None
        for picture in frames:
            for packet in stream.encode(av.VideoFrame.from_image(picture).reformat(format="bgr0")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if track is not None:
            samples = av.AudioFrame.from_ndarray((np.clip(sound, -1, 1) * 32767).astype(np.int16)[None, :],
                                                 format="s16", layout="mono")
            samples.sample_rate = rate
            for packet in [*track.encode(samples), *track.encode(None)]:
                container.mux(packet)
    return out.getvalue()


def decoded_samples(data: bytes, rate: int = 16000) -> np.ndarray:
    """A file's (first) audio track decoded with PyAV (FFmpeg) to mono float32 at `rate`, as any player would."""
    import av

    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        pieces = [out.to_ndarray().reshape(-1) for frame in container.decode(audio=0)
                  for out in resampler.resample(frame)]
        pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    return np.concatenate(pieces)
