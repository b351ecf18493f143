"""Model definitions the engine can run, keyed by Hugging Face architecture."""

from gpuworkers.engine.models.llama import LlamaForCausalLM

ARCHITECTURES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}

__all__ = ["ARCHITECTURES", "LlamaForCausalLM"]
