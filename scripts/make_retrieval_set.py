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

Why: policies and their options must be tuned on documents other than the ones they are
reported on. The default filler is the five papers in ../shared/papers, which the tiny model
never trained on and which share no text with retrieval_dev.jsonl (WikiText-2 test articles).

    scripts/make_retrieval_set.py --out tune.jsonl [--count 100] [--seed 7] [FILE ...]
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


def build_document(rng, pool, target_chars):
    start = rng.randrange(0, max(1, len(pool) - 1))
    chosen, size = [], 0
    i = start
    while size < target_chars:
        s = pool[i % len(pool)]
        chosen.append(s)
        size += len(s) + 1
        i += 1
    num_facts = rng.randint(1, 4)
    keys = set()
    while len(keys) < num_facts:
        keys.add((rng.choice(ADJECTIVES), rng.choice(NOUNS)))
    facts = [(adj, noun, f"{rng.randrange(10000):04d}") for adj, noun in sorted(keys)]
    rng.shuffle(facts)
    # Distinct insertion points between sentences (never before the first).
    slots = sorted(rng.sample(range(1, len(chosen)), num_facts))
    asked = rng.randrange(num_facts)
    out, asked_offset = [], 0
    fact_at = dict(zip(slots, range(num_facts)))
    for idx, s in enumerate(chosen):
        if idx in fact_at:
            adj, noun, digits = facts[fact_at[idx]]
            if fact_at[idx] == asked:
                asked_offset = len(" ".join(out)) + 1
            out.append(f"The secret number of the {adj} {noun} is {digits}.")
        out.append(s)
    body = " ".join(out)
    adj, noun, digits = facts[asked]
    prompt = (f"{body}\nQuestion: What is the secret number of the {adj} {noun}?\n"
              f"Answer: The secret number of the {adj} {noun} is")
    return {"prompt": prompt, "answer": digits, "num_facts": num_facts, "depth": round(asked_offset / len(body), 4)}


def main():
    here = pathlib.Path(__file__).resolve().parent
    default_files = sorted((here.parent.parent / "shared" / "papers").glob("*.txt"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=pathlib.Path, help="filler text files (default: ../shared/papers/*.txt)")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--chars", type=int, default=6300, help="filler characters per document")
    args = ap.parse_args()
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
            doc = build_document(rng, pool, args.chars)
            out.write(json.dumps({"id": i, **doc}) + "\n")
    print(f"wrote {args.count} documents to {args.out} ({len(pool)} filler sentences)")


if __name__ == "__main__":
    main()
