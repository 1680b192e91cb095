"""Which models a worker holds and how they load: manager, loader, quantization, LoRA adapters."""
