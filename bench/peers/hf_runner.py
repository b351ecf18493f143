"""Hugging Face ``generate`` with static batches as a peer, spawned by bench/engine.py.

    python -m bench.peers.hf_runner --workload W --out R --model-dir M ...

The offline requests are cut, in submission order, into batches of
``--hf-batch-size``; each batch is left-padded to its longest prompt and runs
until its longest output is done (static batching: a finished row keeps its
slot). Output tokens/s counts only the tokens each request asked for. All
requests count as submitted at the start, so a request's TTFT is when its
batch produced its first token, and its inter-token gaps are its batch's
step gaps. The multi-turn workload is not run here: static batches have no
prefix cache to measure.
"""

from __future__ import annotations

import itertools
import time

from bench.peers.common import (
    latency_summary,
    median_run,
    progress,
    runner_args,
    set_thread_env,
    write_result,
)
from bench.workloads import Workload

PEER = "hf"


class StepClock:
    """A generate() streamer that only notes when each new token arrives.

    generate() calls put() once with the prompt, then once per step with that
    step's tokens for the whole batch.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._seen_prompt = False

    def put(self, value) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_batches(model, workload: Workload, *, batch_size: int, pad_id: int, torch) -> dict:
    requests = workload.offline
    ttft: list[float] = []
    itl: list[float] = []
    padded_prompt_tokens = 0
    kv_slots_peak = 0
    started = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        longest = max(len(r.prompt_token_ids) for r in batch)
        new_tokens = max(r.max_tokens for r in batch)
        ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, request in enumerate(batch):
            n = len(request.prompt_token_ids)
            ids[row, longest - n :] = torch.tensor(request.prompt_token_ids)
            mask[row, longest - n :] = 1
        progress(
            PEER,
            f"batch {first // batch_size + 1}/{-(-len(requests) // batch_size)}: "
            f"{len(batch)} x {longest} prompt, {new_tokens} new",
        )
        clock = StepClock()
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=False,
                streamer=clock,
            )
        if out.shape[1] - longest != new_tokens:
            raise RuntimeError(f"generate stopped at {out.shape[1] - longest} of {new_tokens}")
        padded_prompt_tokens += len(batch) * longest
        kv_slots_peak = max(kv_slots_peak, len(batch) * (longest + new_tokens))
        for request in batch:
            times = clock.times[: request.max_tokens]
            ttft.append(times[0] - started)
            itl.extend(b - a for a, b in itertools.pairwise(times))
    elapsed = time.perf_counter() - started
    tokens = sum(r.max_tokens for r in requests)
    return {
        "requests": len(requests),
        "output_tokens": tokens,
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "padded_prompt_tokens": padded_prompt_tokens,
        "elapsed_s": round(elapsed, 3),
        "tok_s": round(tokens / elapsed, 2),
        "ttft": latency_summary(ttft),
        "itl": latency_summary(itl),
        # A dense cache per batch: rows x (longest prompt + longest output).
        "kv_tokens_used_peak": kv_slots_peak,
    }


def main() -> None:
    args = runner_args(__doc__)
    set_thread_env(args.threads)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    workload = Workload.from_json(args.workload)
    progress(PEER, f"loading {args.model_dir.name} ({args.dtype})")
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
    )
    model.eval()
    pad_id = model.generation_config.pad_token_id or 0
    # ignore_eos: with no EOS id generate() runs every row to max_new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad_id
    load_s = time.perf_counter() - started
    progress(PEER, f"loaded in {load_s:.1f} s; warm-up")
    with torch.inference_mode():
        warm = torch.tensor([workload.offline[0].prompt_token_ids[:32]] * 2)
        model.generate(input_ids=warm, max_new_tokens=4, do_sample=False)

    result: dict = {
        "peer": PEER,
        "version": transformers.__version__,
        "torch": torch.__version__,
        "dtype": args.dtype,
        "threads": args.threads,
        "load_s": round(load_s, 2),
        "settings": {"batch_size": args.hf_batch_size, "attn_implementation": "sdpa"},
    }
    if "offline" in args.phases.split(","):
        runs = []
        for i in range(args.repeat):
            progress(PEER, f"offline run {i + 1}/{args.repeat}: {len(workload.offline)} requests")
            run = run_batches(
                model, workload, batch_size=args.hf_batch_size, pad_id=pad_id, torch=torch
            )
            progress(PEER, f"offline run {i + 1}: {run['tok_s']} tok/s in {run['elapsed_s']} s")
            runs.append(run)
        result["offline"] = dict(median_run(runs), runs_tok_s=[r["tok_s"] for r in runs])
    write_result(args.out, result)
    progress(PEER, "done")


if __name__ == "__main__":
    main()
