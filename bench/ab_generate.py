"""Wall time of one small greedy batch, for A/B runs of two checkouts.

    PYTHONPATH=. python -m bench.ab_generate    (run in each checkout)

8 requests (prompts 16..128 random ids, 32 greedy tokens, ignore_eos),
bfloat16, 2 threads; one warm-up batch, then four timed ones. No peer: it
compares this engine with itself across a change (bench.engine is the
peer comparison).
"""

import time

import torch

from gpuworkers.engine import LLMEngine, SamplingParams
from gpuworkers.engine.convert_gguf import ensure_demo_model

torch.set_num_threads(2)
e = LLMEngine.from_pretrained(ensure_demo_model(), dtype="auto", max_model_len=2048)
e.warmup()
g = torch.Generator().manual_seed(0)
prompts = [
    torch.randint(100, 30000, (n,), generator=g).tolist()
    for n in (16, 40, 64, 90, 100, 110, 120, 128)
]
p = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
e.generate(prompts, p)
t = time.perf_counter()
e.generate(prompts, p)
print("wall", round(time.perf_counter() - t, 3))
for _ in range(3):
    t = time.perf_counter()
    e.generate(prompts, p)
    print("wall", round(time.perf_counter() - t, 3))
