#!/usr/bin/env python3
"""Build retrieval documents in the format of ../shared/data/retrieval_dev.jsonl from any text.

A document is ~6300 characters (~2000 tokens of the tiny model's tokenizer) of consecutive
sentences from the given files, with 1-4 facts
    " The secret number of the {adjective} {noun} is {4 digits}."
inserted between sentences at random places, and ends with the question about one of them:
    "\\nQuestion: What is the secret number of the {adjective} {noun}?\\nAnswer: The secret number
    of the {adjective} {noun} is"
The answer is the 4 digits. `depth` is where the asked fact starts, as a fraction of the
document, and `num_facts` how many facts it holds.

Multi-turn (--turns N): a document holds N to max(N, 4) facts and each item also has
    "document": the filler with its facts (no question),
    "turns": [{"question": "\\nQuestion: ...?\\nAnswer: The secret number of the ... is",
               "answer": "1234", "depth": 0.41}, ...]
N questions about N different facts, in random order. Turn k's prompt is the document, then
for each earlier turn its question and the answer given (the model's own, or " 1234." for
the gold history), then turn k's question: the task's format repeated, each question right
after the previous answer. "prompt" / "answer" / "depth" stay those of the first turn, so
readers of the single-question format read the same documents. Keep document + turns within
the tiny model's trained context of 2048 tokens: on the papers each turn adds ~37 tokens and
--chars 4000 makes ~1400-token documents, enough for 4 turns (--chars 3000 for 8).

Why: policies and their options must be tuned on documents other than the ones they are
reported on. The default filler is the five papers in ../shared/papers, which the tiny model
never trained on and which share no text with retrieval_dev.jsonl (WikiText-2 test articles).

    scripts/make_retrieval_set.py --out tune.jsonl [--count 100] [--seed 7] [FILE ...]
    scripts/make_retrieval_set.py --out tune_mt.jsonl --turns 4 --chars 4000 [--count 100]
"""
import argparse
import json
import pathlib
import random
import re
import sys

ADJECTIVES = ("red blue green yellow purple silver golden black white orange brave quiet happy sleepy tiny giant "
              "ancient frozen hidden lucky").split()
NOUNS = ("fox whale tiger river castle garden dragon lantern harbor violin comet forest mirror engine falcon island "
         "rabbit tower meadow compass").split()


def sentences(text):
    # Collapse whitespace, then cut after ., ! or ? followed by a space and an upper-case letter.
    flat = re.sub(r"\s+", " ", text).strip()
    parts = re.split(r"(?<=[.!?]) (?=[A-Z])", flat)
    return [p for p in parts if 20 <= len(p) <= 600]


def question_for(adj, noun):
    return (f"\nQuestion: What is the secret number of the {adj} {noun}?\n"
            f"Answer: The secret number of the {adj} {noun} is")


def build_document(rng, pool, target_chars, turns=0):
    """turns = 0: the single-question item; turns >= 1: also "document" and "turns"."""
    start = rng.randrange(0, max(1, len(pool) - 1))
    chosen, size = [], 0
    i = start
    while size < target_chars:
        s = pool[i % len(pool)]
        chosen.append(s)
        size += len(s) + 1
        i += 1
    num_facts = rng.randint(1, 4) if turns == 0 else rng.randint(turns, max(turns, 4))
    if num_facts >= len(chosen):
        sys.exit(f"make_retrieval_set: {num_facts} facts do not fit between {len(chosen)} sentences; raise --chars")
    keys = set()
    while len(keys) < num_facts:
        keys.add((rng.choice(ADJECTIVES), rng.choice(NOUNS)))
    facts = [(adj, noun, f"{rng.randrange(10000):04d}") for adj, noun in sorted(keys)]
    rng.shuffle(facts)
    # Distinct insertion points between sentences (never before the first).
    slots = sorted(rng.sample(range(1, len(chosen)), num_facts))
    # The facts asked, in the order asked: one for a single question, else `turns` distinct ones.
    asked = [rng.randrange(num_facts)] if turns == 0 else rng.sample(range(num_facts), turns)
    out, offsets = [], {}
    fact_at = dict(zip(slots, range(num_facts)))
    for idx, s in enumerate(chosen):
        if idx in fact_at:
            adj, noun, digits = facts[fact_at[idx]]
            offsets[fact_at[idx]] = len(" ".join(out)) + 1
            out.append(f"The secret number of the {adj} {noun} is {digits}.")
        out.append(s)
    body = " ".join(out)
    depth = {k: round(offsets[k] / len(body), 4) for k in asked}
    adj, noun, digits = facts[asked[0]]
    item = {"prompt": body + question_for(adj, noun), "answer": digits, "num_facts": num_facts, "depth": depth[asked[0]]}
    if turns > 0:
        item["document"] = body
        item["turns"] = [{"question": question_for(facts[k][0], facts[k][1]), "answer": facts[k][2], "depth": depth[k]}
                         for k in asked]
    return item


def main():
    here = pathlib.Path(__file__).resolve().parent
    default_files = sorted((here.parent.parent / "shared" / "papers").glob("*.txt"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=pathlib.Path, help="filler text files (default: ../shared/papers/*.txt)")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--chars", type=int, default=6300, help="filler characters per document")
    ap.add_argument("--turns", type=int, default=0,
                    help="multi-turn items: this many questions about distinct facts (0: single question)")
    args = ap.parse_args()
    if not 0 <= args.turns <= len(ADJECTIVES) * len(NOUNS):
        sys.exit(f"make_retrieval_set: --turns must be in [0, {len(ADJECTIVES) * len(NOUNS)}], got {args.turns}")
    files = args.files or default_files
    if not files:
        sys.exit("make_retrieval_set: no filler files (pass some, or put ../shared beside the checkout)")
    pool = []
    for f in files:
        pool.extend(sentences(f.read_text(encoding="utf-8", errors="replace")))
    if len(pool) < 50:
        sys.exit(f"make_retrieval_set: only {len(pool)} usable sentences in the filler; need at least 50")
    rng = random.Random(args.seed)
    with args.out.open("w", encoding="utf-8") as out:
        for i in range(args.count):
            doc = build_document(rng, pool, args.chars, args.turns)
            out.write(json.dumps({"id": i, **doc}) + "\n")
    print(f"wrote {args.count} documents to {args.out} ({len(pool)} filler sentences)")


if __name__ == "__main__":
    main()
