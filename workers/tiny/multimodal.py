"""Offline builders for tiny multimodal models: a LLaVA-shaped vision-language model, a
Qwen2-Audio-shaped audio-language model and a Whisper.

Like `tiny_models`: random weights with a fixed seed, a tokenizer trained on the shipped
corpus, the processor saved beside the weights, all written into the Hugging Face cache
layout, no network. The image processor is the PIL one (transformers' torchvision-backed
processors cannot run with this project's torch build), and the shapes are the real
architectures' so `AutoProcessor` / `AutoModelForImageTextToText` /
`AutoModelForMultimodalLM` / `AutoModelForSpeechSeq2Seq` load them exactly as they would a hub model.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from workers.tiny.builders import CORPUS_PATH, SIZES, _save_and_install, train_tokenizer

IMAGE_TOKEN = "<image>"
VLM_IMAGE_SIZE = 32
VLM_PATCH_SIZE = 8
AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
AUDIO_LM_CHUNK_SECONDS = 10  # the audio LM's window (Qwen2-Audio's is 30 s): longer audio is cut there, as theirs
WHISPER_MEL_BINS = 80
WHISPER_TIMESTAMPS = 1501
WHISPER_MAX_LENGTH = 48  # tokens per 30 s window: a random decoder rarely stops on its own  # <|0.00|> … <|30.00|> in steps of 0.02 s, as Whisper's vocabulary has


def build_tiny_vlm(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A LLaVA (CLIP vision tower + Llama) with its LlavaProcessor; 16 image tokens per image."""
    import torch
    from transformers import CLIPVisionConfig, GenerationConfig, LlamaConfig, LlavaConfig
    from transformers import LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    spec = dict(SIZES["tiny"])
    lm_head_scale = spec.pop("lm_head_scale")
    tokenizer = train_tokenizer(spec.pop("vocab_target"), spec["max_position_embeddings"])
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_processor = LlavaImageProcessorPil(
        size={"shortest_edge": VLM_IMAGE_SIZE}, crop_size={"height": VLM_IMAGE_SIZE, "width": VLM_IMAGE_SIZE})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=VLM_PATCH_SIZE,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=tokenizer.chat_template, image_token=IMAGE_TOKEN)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    text_config = LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=False, rms_norm_eps=1e-5, **ids, **spec)
    vision_config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     image_size=VLM_IMAGE_SIZE, patch_size=VLM_PATCH_SIZE, projection_dim=32,
                                     initializer_range=0.2)
    config = LlavaConfig(vision_config=vision_config, text_config=text_config,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).to(torch.float32).eval()
        with torch.no_grad():  # as the text model: a larger init so the image changes the answer
            for parameter in model.model.multi_modal_projector.parameters():
                parameter.normal_(0.0, 0.2)
            model.lm_head.weight.mul_(lm_head_scale)
    model.generation_config = GenerationConfig(**ids)
    return _save_and_install(model, processor, cache_dir, repo_id)


def audio_chat_template(template: str) -> str:
    """The tiny ChatML template with an audio part written as Qwen2-Audio's processor expects it:
    `<|audio_bos|><|AUDIO|><|audio_eos|>`, its one `<|AUDIO|>` expanded by the processor to one token
    per audio feature."""
    image_branch = "{%- elif part.type == 'image' -%}"
    assert image_branch in template
    return template.replace(image_branch, "{%- elif part.type == 'audio' -%}\n"
                            f"                {{{{- '{AUDIO_BOS}{AUDIO_TOKEN}{AUDIO_EOS}' -}}}}\n"
                            f"            {image_branch}")


def build_tiny_audio_lm(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A Qwen2-Audio (Whisper-like audio encoder + Qwen2 text model) with its Qwen2AudioProcessor.

    80-bin log-mel features over 10 s windows; one audio token per 40 ms of audio (25 per second).
    """
    import torch
    from transformers import GenerationConfig, Qwen2AudioConfig, Qwen2AudioEncoderConfig
    from transformers import Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor, Qwen2Config
    from transformers import WhisperFeatureExtractor

    spec = dict(SIZES["tiny"])
    lm_head_scale = spec.pop("lm_head_scale")
    tokenizer = train_tokenizer(spec.pop("vocab_target"), spec["max_position_embeddings"])
    tokenizer.add_special_tokens({"additional_special_tokens": [AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS]})
    tokenizer.chat_template = audio_chat_template(tokenizer.chat_template)
    extractor = WhisperFeatureExtractor(feature_size=WHISPER_MEL_BINS, chunk_length=AUDIO_LM_CHUNK_SECONDS)
    processor = Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=tokenizer,
                                    chat_template=tokenizer.chat_template, audio_token=AUDIO_TOKEN,
                                    audio_bos_token=AUDIO_BOS, audio_eos_token=AUDIO_EOS)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    text_config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=False, rms_norm_eps=1e-5, **ids, **spec)
    # The encoder takes exactly max_source_positions * 2 mel frames (its two convolutions halve them once).
    audio_config = Qwen2AudioEncoderConfig(
        num_mel_bins=WHISPER_MEL_BINS, d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
        max_source_positions=extractor.nb_max_frames // 2, init_std=0.2)
    config = Qwen2AudioConfig(audio_config=audio_config, text_config=text_config,
                              audio_token_index=tokenizer.convert_tokens_to_ids(AUDIO_TOKEN))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2AudioForConditionalGeneration(config).to(torch.float32).eval()
        with torch.no_grad():  # as the VLM: a larger init so the audio changes the answer
            for parameter in model.model.multi_modal_projector.parameters():
                parameter.normal_(0.0, 0.2)
            model.lm_head.weight.mul_(lm_head_scale)
    model.generation_config = GenerationConfig(**ids)
    return _save_and_install(model, processor, cache_dir, repo_id)


def whisper_tokenizer():
    """A WhisperTokenizer over a BPE trained on the corpus, with Whisper's special and timestamp tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizer
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train([str(CORPUS_PATH)], trainers.BpeTrainer(
        vocab_size=1000, special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    # Added tokens come after the trained vocabulary, <|endoftext|> first, as in Whisper's (its
    # prompt handling takes every id from <|endoftext|>'s on as special).
    tokenizer = WhisperTokenizer(vocab=state["vocab"], merges=merges)
    specials = (["<|startoftranscript|>"] + [f"<|{code}|>" for code in LANGUAGES]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                   "<|notimestamps|>"])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(WHISPER_TIMESTAMPS)])
    return tokenizer


def build_tiny_whisper(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A Whisper encoder-decoder with its WhisperProcessor (80-bin log-mel features, 30 s windows).

    Every special and timestamp token but the end of text is suppressed in generation_config,
    so the random decoder writes text from the trained vocabulary; its `alignment_heads` give
    token (and so word) timestamps.
    """
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor
    from transformers import WhisperForConditionalGeneration, WhisperProcessor
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    tokenizer = whisper_tokenizer()
    processor = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=WHISPER_MEL_BINS),
                                 tokenizer=tokenizer)
    token = tokenizer.convert_tokens_to_ids
    end = token("<|endoftext|>")
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=WHISPER_MEL_BINS, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=1500, max_target_positions=448, init_std=0.2,
        pad_token_id=end, bos_token_id=end, eos_token_id=end, decoder_start_token_id=token("<|startoftranscript|>"),
        begin_suppress_tokens=None, suppress_tokens=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = WhisperForConditionalGeneration(config).to(torch.float32).eval()
    lang_to_id = {f"<|{code}|>": token(f"<|{code}|>") for code in LANGUAGES}
    task_to_id = {"transcribe": token("<|transcribe|>"), "translate": token("<|translate|>")}
    first_added = token("<|startoftranscript|>")
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=end, eos_token_id=end, pad_token_id=end,
        # task: a hub Whisper's forced_decoder_ids put <|transcribe|> in the decoder prompt when a call
        # names no task (as the ASR pipeline's); without it the prompt would hold no task token at all.
        is_multilingual=True, lang_to_id=lang_to_id, task_to_id=task_to_id, task="transcribe",
        no_timestamps_token_id=token("<|notimestamps|>"), prev_sot_token_id=token("<|startofprev|>"),
        max_initial_timestamp_index=50, max_length=WHISPER_MAX_LENGTH, begin_suppress_tokens=[end],
        suppress_tokens=list(range(first_added, len(tokenizer))),
        # For word timestamps: every head of the last half of the decoder layers (OpenAI's default for a
        # model without chosen alignment heads).
        alignment_heads=[[layer, head] for layer in range(config.decoder_layers // 2, config.decoder_layers)
                         for head in range(config.decoder_attention_heads)])
    return _save_and_install(model, processor, cache_dir, repo_id)
