"""dflash-trt: DFlash speculative decoding, from Hugging Face checkpoints to TensorRT-LLM."""

__version__ = "0.1.0"
