"""One choice's place in its grammar, and the step's batched bitmask.

State lives on the ``Sequence`` and advances only when a token is
appended, so preemption needs nothing: a recompute or swap keeps the
sequence's output tokens and this state with them, and the next token is
masked exactly as it would have been. Choices of an n > 1 request each
hold their own state from the start (all at the grammar's start when the
prompt's last row is shared), so a fork copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# One executor per process: its threads compute a step's masks in parallel.
_executor = None


@dataclass(slots=True)
class GrammarState:
    matcher: object  # llguidance.LLMatcher

    def advance(self, token: int) -> bool:
        """Consume the sampled token; True when the choice must end here:
        the grammar is complete (only EOS could follow), or the token broke
        it (possible only when other settings, such as bad_words, masked
        every token the grammar allowed)."""
        ok = self.matcher.consume_token(token)
        return not ok or self.matcher.is_stopped()

    @property
    def is_complete(self) -> bool:
        """The output so far is a whole sentence of the grammar."""
        return self.matcher.is_accepting()


def allowed_tokens(states: list[GrammarState], vocab_size: int) -> torch.Tensor:
    """[len(states), vocab_size] bool: the tokens each state allows next.

    The masks are computed in parallel (llguidance's executor releases the
    GIL) into one int32 bitmask, bit t % 32 of word t // 32 for token t,
    then unpacked in one numpy call.
    """
    global _executor
    words = (vocab_size + 31) // 32
    bitmask = torch.empty((len(states), words), dtype=torch.int32)
    # llguidance.torch's wrappers do only this, but importing that module
    # compiles a torch kernel (torch._dynamo) the engine never uses.
    row_bytes = words * 4
    if len(states) == 1:
        states[0].matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), row_bytes)
    else:
        if _executor is None:
            import llguidance

            _executor = llguidance.LLExecutor()
        pairs = [(state.matcher, i) for i, state in enumerate(states)]
        _executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), row_bytes, len(states))
    # Words are little-endian in memory, so little bit order per byte
    # lists the tokens in order.
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size]).bool()
