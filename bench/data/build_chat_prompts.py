"""Builds the real-text prompt files of bench.pairs in bench/data/.

    python bench/data/build_chat_prompts.py [--austen DIR] [--out PATH]

Three kinds of user message, from text with a clear licence (see
bench/data/README.md):

- a passage of one of Jane Austen's six novels (public domain; as Debian's
  ``r-cran-janeaustenr`` ships them, MIT) with an instruction about it;
- a passage of the Python language reference as the running interpreter's
  ``pydoc_data.topics`` ships it (PSF licence) with an instruction;
- a short question written for this project.

It also writes ``edit_passages_austen.txt``: passages of the novels of
150..260 words, one a line, that the copy-edit suite misspells and asks
the model to copy with the mistakes fixed.

Without ``--austen`` the Debian package is fetched with ``apt-get
download`` into a temporary folder and unpacked with ``dpkg -x``. The
output is seeded: the same inputs give the same file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
AUSTEN_DATA = Path("usr/lib/R/site-library/janeaustenr/data")
TITLES = {
    "emma": "Emma",
    "mansfieldpark": "Mansfield Park",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
    "prideprejudice": "Pride and Prejudice",
    "sensesensibility": "Sense and Sensibility",
}

# Instructions written for this project; {title} is the novel's.
NOVEL_INSTRUCTIONS = (
    "Summarize this passage from {title} in three sentences.",
    "Rewrite the following passage from {title} in plain modern English.",
    "Who speaks in this passage from {title}, and what do they want?",
    "What does this passage from {title} tell us about the characters' feelings?",
    "List the people mentioned in this passage and say one thing about each.",
    "Explain the irony in this passage from {title}, if there is any.",
    "Write a short reply to this passage as if you were one of its characters.",
    "Give this passage a title and explain your choice.",
    "What happens in this passage? Answer in a few bullet points.",
    "Translate the tone of this passage into a modern text message conversation.",
)
DOC_INSTRUCTIONS = (
    "Explain this part of the Python language reference to a beginner, with an example.",
    "Summarize the rules described in this documentation in a short list.",
    "Write a small Python program that demonstrates what this text describes.",
    "What are the common mistakes a programmer could make with what this text describes?",
    "Rewrite this documentation as a short tutorial.",
)
# Questions written for this project.
QUESTIONS = (
    "What is the difference between a list and a tuple in Python?",
    "How do I reverse a string in Python?",
    "Write a haiku about the sea in winter.",
    "Explain what a hash table is and why lookups are fast.",
    "Give me three ideas for a quick vegetarian dinner.",
    "What causes the seasons on Earth?",
    "How does a bicycle stay upright when it moves?",
    "Write a short email asking my landlord to fix a leaking tap.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain recursion with a simple example.",
    "Why is the sky blue?",
    "What are the main causes of inflation?",
    "Suggest a name for a small bakery that sells sourdough bread.",
    "How do vaccines train the immune system?",
    "Write a limerick about a cat who loves boxes.",
    "What is the difference between weather and climate?",
    "Explain how compound interest works with an example.",
    "How can I improve my sleep?",
    "What is a prime number? List the first ten.",
    "Describe the water cycle in simple terms.",
    "Write a SQL query that counts orders per customer.",
    "What is the difference between a process and a thread?",
    "Give me a packing list for a two-day hiking trip.",
    "Explain what an API is to someone who does not program.",
    "How do plants make their food?",
    "Write a short story opening set in a lighthouse.",
    "What is the Pythagorean theorem? Give an example.",
    "How do I make a good cup of tea?",
    "What are the pros and cons of working from home?",
    "Explain the rules of chess in a few sentences.",
    "What is a black hole?",
    "Write a polite message declining a meeting invitation.",
    "How does a refrigerator keep food cold?",
    "What is the difference between HTTP and HTTPS?",
    "Suggest five questions to ask at the end of a job interview.",
    "Explain what a binary search does and when to use it.",
    "What are some tips for learning a new language?",
    "Write a product description for a reusable water bottle.",
    "Why do we have leap years?",
    "What is machine learning, in two paragraphs?",
    "How do I center a div in CSS?",
    "Describe a typical day of a medieval farmer.",
    "What is the difference between affect and effect?",
    "Write a thank-you note to a teacher.",
    "How does GPS know where I am?",
    "Explain the difference between RAM and disk storage.",
    "What should I consider when adopting a dog?",
    "Write a Python function that checks whether a word is a palindrome.",
    "Why does ice float on water?",
    "Give me a simple workout I can do at home in twenty minutes.",
    "What is photosynthesis?",
    "Explain what version control is and why teams use it.",
    "What were the main causes of the First World War?",
    "Write a short poem about autumn leaves.",
    "How do I write a good cover letter?",
    "What is the difference between a virus and a bacterium?",
    "Explain big-O notation with two examples.",
    "Plan a three-day trip to a city with museums and parks.",
    "How do noise-cancelling headphones work?",
    "What is the difference between mean and median, and when does it matter?",
)

PASSAGE_WORDS = (40, 420)
EDIT_WORDS = (150, 260)


def read_r_strings(blob: bytes) -> list[str]:
    """The character vector in one serialized R object (XDR, version 2 or 3)."""
    assert blob[:2] == b"X\n", "not an XDR-serialized R object"
    pos = 2
    version = struct.unpack_from(">i", blob, pos)[0]
    pos += 12
    if version == 3:
        (length,) = struct.unpack_from(">i", blob, pos)
        pos += 4 + length
    flags, count = struct.unpack_from(">ii", blob, pos)
    pos += 8
    assert flags & 0xFF == 16, "expected a character vector (STRSXP)"
    out = []
    for _ in range(count):
        _flags, length = struct.unpack_from(">ii", blob, pos)
        pos += 8
        if length < 0:
            out.append("")
            continue
        out.append(blob[pos : pos + length].decode("utf-8"))
        pos += length
    return out


def austen_novels(root: Path) -> dict[str, list[str]]:
    """{novel key: its lines} from janeaustenr's lazy-load database."""
    index = gzip.decompress((root / "Rdata.rdx").read_bytes())
    database = (root / "Rdata.rdb").read_bytes()
    # The index's "variables" list holds (offset, length) per object; each
    # record is a 4-byte uncompressed size followed by a zlib stream.
    spans = re.findall(rb"\x00\x00\x00\r\x00\x00\x00\x02(.{8})", index, re.S)
    novels = {}
    for key, span in zip(sorted(TITLES), spans, strict=True):
        offset, length = struct.unpack(">ii", span)
        record = database[offset : offset + length]
        lines = read_r_strings(zlib.decompress(record[4:]))
        # The index lists the objects by name in sorted order; the title
        # on a novel's first line proves the pairing.
        assert lines[0].strip().lower() == TITLES[key].lower(), (key, lines[0])
        novels[key] = lines
    return novels


def paragraphs(lines: list[str]) -> list[str]:
    """Blank-line separated paragraphs, chapter headings left out."""
    out, current = [], []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            text = " ".join(current)
            if not re.match(r"^(CHAPTER|VOLUME|Chapter)\b", text):
                out.append(text)
            current = []
    return out


def passages(
    paras: list[str], rng: random.Random, count: int, words: tuple[int, int] = PASSAGE_WORDS
) -> list[str]:
    """``count`` runs of consecutive paragraphs of ``words`` words (a range)."""
    out = []
    while len(out) < count:
        start = rng.randrange(len(paras))
        target = rng.randint(*words)
        total, chosen = 0, []
        for para in paras[start:]:
            chosen.append(para)
            total += len(para.split())
            if total >= target:
                break
        if words[0] <= total <= words[1] * 1.3:
            out.append("\n\n".join(chosen))
    return out


def python_docs(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(topic, passage) from the language reference's topics."""
    from pydoc_data.topics import topics

    out = []
    names = sorted(topics)
    while len(out) < count:
        name = rng.choice(names)
        paras = [p.strip() for p in topics[name].split("\n\n") if p.strip()]
        start = rng.randrange(len(paras))
        target = rng.randint(*PASSAGE_WORDS)
        text = ""
        for para in paras[start:]:
            text = f"{text}\n\n{para}" if text else para
            if len(text.split()) >= target:
                break
        if PASSAGE_WORDS[0] <= len(text.split()) <= PASSAGE_WORDS[1] * 1.3:
            out.append((name, text))
    return out


def fetch_austen(tmp: Path) -> Path:
    subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp, check=True)
    deb = next(tmp.glob("r-cran-janeaustenr_*.deb"))
    subprocess.run(["dpkg", "-x", str(deb), str(tmp / "x")], check=True)
    return tmp / "x" / AUSTEN_DATA


def build(
    novels: dict[str, list[str]], *, seed: int, novel_count: int, doc_count: int
) -> list[dict]:
    """The chat messages, shuffled."""
    rng = random.Random(seed)
    messages = []
    per_novel = -(-novel_count // len(novels))
    for key in sorted(novels):
        for text in passages(paragraphs(novels[key]), rng, per_novel):
            instruction = rng.choice(NOVEL_INSTRUCTIONS).format(title=TITLES[key])
            messages.append({"source": f"austen:{key}", "message": f"{instruction}\n\n{text}"})
    for topic, text in python_docs(rng, doc_count):
        instruction = rng.choice(DOC_INSTRUCTIONS)
        messages.append({"source": f"pydoc:{topic}", "message": f"{instruction}\n\n{text}"})
    messages += [{"source": "written", "message": q} for q in QUESTIONS]
    rng.shuffle(messages)
    return messages


def edit_passages(novels: dict[str, list[str]], *, seed: int, count: int) -> list[str]:
    """Passages for the copy-edit suite, one paragraph run per line."""
    rng = random.Random(seed + 1)
    per_novel = -(-count // len(novels))
    out = []
    for key in sorted(novels):
        chosen = passages(paragraphs(novels[key]), rng, per_novel, EDIT_WORDS)
        out += [" ".join(text.split()) for text in chosen]
    return out[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--austen", type=Path, help="janeaustenr's data/ folder, unpacked")
    parser.add_argument("--out", type=Path, default=HERE / "chat_prompts.jsonl")
    parser.add_argument("--edit-out", type=Path, default=HERE / "edit_passages_austen.txt")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--novel-passages", type=int, default=240)
    parser.add_argument("--doc-passages", type=int, default=100)
    parser.add_argument("--edit-passages", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chat-prompts-") as tmp:
        novels = austen_novels(args.austen or fetch_austen(Path(tmp)))
    messages = build(
        novels, seed=args.seed, novel_count=args.novel_passages, doc_count=args.doc_passages
    )
    args.out.write_text("".join(json.dumps(m, ensure_ascii=False) + "\n" for m in messages))
    print(f"wrote {len(messages)} messages to {args.out}")
    edits = edit_passages(novels, seed=args.seed, count=args.edit_passages)
    args.edit_out.write_text("".join(line + "\n" for line in edits))
    print(f"wrote {len(edits)} passages to {args.edit_out}")


if __name__ == "__main__":
    main()
