#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (tests/fuzz/seeds/<harness>/) from the real fixtures: the
shared models, configs and tokenizers (../shared) and the Jinja cases (tests/data/jinja).
Large fixtures are cut down so that one execution stays cheap: tokenizers keep their first
vocabulary entries and the merges among them, safetensors files keep their header and a short
data section. Run again after a fixture changes: python3 tests/fuzz/make_seeds.py [SHARED_DIR]"""
import hashlib
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(HERE, "seeds")


def write(harness, data, name=None):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    name = name or hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


# ------------------------------------------------------------------ safetensors
def safetensors_bytes(tensors, metadata=None, pad=0):
    """tensors: list of (name, dtype, shape, element size)."""
    header, offset, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, esize in tensors:
        n = esize
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        data += bytes((offset + i) % 251 for i in range(n))
        offset += n
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data + b"\0" * pad


def safetensors_seeds():
    for model in ("stories260k", "origami-tiny-qwen3"):
        mdir = os.path.join(SHARED, "models", model)
        for f in sorted(os.listdir(mdir)):
            if not f.endswith(".safetensors"):
                continue
            raw = read(os.path.join(mdir, f), "rb")
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8:8 + n])
            write("safetensors", raw[:8 + n + 64], f"{model}_{f}_truncated")
            # The same tensor table with every shape shrunk to a few elements: accepted.
            small, keep = [], sorted(k for k in header if k != "__metadata__")[:12]
            for k in keep:
                e = header[k]
                esize = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4}.get(e["dtype"], 1)
                small.append((k, e["dtype"], [min(d, 3) for d in e["shape"]], esize))
            write("safetensors", safetensors_bytes(small, header.get("__metadata__")), f"{model}_{f}_small")
    write("safetensors", safetensors_bytes([("a", "F32", [2, 3], 4), ("b", "BF16", [4], 2), ("c", "I64", [1], 8),
                                            ("empty", "F16", [0, 5], 2), ("scalar", "F32", [], 4)],
                                           {"format": "pt"}), "mixed_dtypes")
    write("safetensors", safetensors_bytes([("x", "U8", [5], 1), ("y", "F8_E4M3", [2, 2], 1)], pad=7), "bytes_padded")
    write("safetensors", struct.pack("<Q", 2) + b"{}", "empty_header")


# ------------------------------------------------------------------ config.json
def config_seeds():
    for sub in ("configs", "models"):
        for name in sorted(os.listdir(os.path.join(SHARED, sub))):
            p = os.path.join(SHARED, sub, name, "config.json")
            if os.path.exists(p):
                write("model_config", read(p), f"{sub}_{name}")


# ------------------------------------------------------------------ tokenizer.json
def cut_tokenizer(tok, keep):
    """The first `keep` vocabulary ids and the merges among them (added tokens renumbered after)."""
    model = tok["model"]
    vocab = {k: v for k, v in model["vocab"].items() if v < keep}
    merges = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    out = dict(tok)
    out["model"] = dict(model, vocab=vocab, merges=merges)
    added = []
    for i, a in enumerate(tok.get("added_tokens", [])):
        added.append(dict(a, id=len(vocab) + i))
    out["added_tokens"] = added
    return out


def tokenizer_seeds():
    texts = ["Hello world! It's 2024.", "  naïve café\n\tÜber 日本語 😀", "<|im_start|>user\nhi<|im_end|>", "<s>a</s>",
             "a\r\n\r\n  b    c's 'LL 123456 ..."]
    tiny = os.path.join(SHARED, "models", "origami-tiny-qwen3")
    stories = os.path.join(SHARED, "models", "stories260k")
    s_tok = read(os.path.join(stories, "tokenizer.json"))
    s_cfg = read(os.path.join(stories, "tokenizer_config.json"))
    write("tokenizer_json", s_tok, "stories260k")
    write("tokenizer_json", s_tok + "\0" + s_cfg, "stories260k_config")
    write("tokenizer_json", s_tok + "\0" + s_cfg + "\0" + texts[1], "stories260k_config_text")
    q = json.loads(read(os.path.join(tiny, "tokenizer.json")))
    q_cfg = read(os.path.join(tiny, "tokenizer_config.json"))
    small = json.dumps(cut_tokenizer(q, 300), ensure_ascii=False)
    write("tokenizer_json", small, "tiny_qwen3_cut")
    write("tokenizer_json", small + "\0" + q_cfg + "\0" + texts[2], "tiny_qwen3_cut_config_text")
    big = json.loads(read(os.path.join(SHARED, "tokenizers", "qwen3", "tokenizer.json")))
    big_cfg = json.loads(read(os.path.join(SHARED, "tokenizers", "qwen3", "tokenizer_config.json")))
    big_cfg.pop("chat_template", None)
    write("tokenizer_json", json.dumps(cut_tokenizer(big, 260), ensure_ascii=False) + "\0" + json.dumps(big_cfg),
          "qwen3_cut_config")
    for i, t in enumerate(texts):
        for which in (0, 1):
            write("tokenizer_encode", bytes([which]) + t.encode(), f"text{i}_{which}")
    wiki = read(os.path.join(SHARED, "data", "wikitext2_test_dev.txt")).splitlines()
    for i, line in enumerate([l for l in wiki if len(l) > 40][:6]):
        write("tokenizer_encode", bytes([i % 2]) + line[:300].encode(), f"wikitext{i}")


# ------------------------------------------------------------------ chat templates
def chat_template_seeds():
    cases = json.loads(read(os.path.join(ROOT, "tests", "data", "jinja", "cases.json")))
    for c in cases:
        write("chat_template", c["template"] + "\0" + json.dumps(c["context"], ensure_ascii=False), c["name"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}, {"role": "user", "content": "why"}]
    for name, path in (("qwen3", os.path.join(SHARED, "tokenizers", "qwen3", "tokenizer_config.json")),
                       ("tiny_qwen3", os.path.join(SHARED, "models", "origami-tiny-qwen3", "tokenizer_config.json"))):
        tmpl = json.loads(read(path))["chat_template"]
        write("chat_template", tmpl + "\0" + json.dumps(messages), f"{name}_messages")
        write("chat_template", tmpl + "\0" + json.dumps({"messages": messages, "enable_thinking": False,
                                                        "add_generation_prompt": True}), f"{name}_vars")
        write("chat_template", tmpl, f"{name}_default_messages")


# ------------------------------------------------------------------ JSONL requests
def request_seeds():
    lines = [l for l in read(os.path.join(SHARED, "data", "retrieval_dev.jsonl")).splitlines() if l.strip()]
    for i, l in enumerate(lines[:3]):
        obj = json.loads(l)
        if isinstance(obj.get("prompt"), str):
            obj["prompt"] = obj["prompt"][:200]
        write("request_jsonl", json.dumps(obj), f"retrieval_dev{i}")
    reqs = [
        {"prompt": "Hello", "max_tokens": 8, "temperature": 0},
        {"prompt": [1, 2, 3], "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
         "stop": ["\n", "END"], "stop_token_ids": [0, 2], "ignore_eos": True, "include_stop_str_in_output": False},
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False}, "stop": "x"},
        {"prompt": "p", "kv_policy": "zipage", "kv_budget": 512, "kv_policy_options": {"window": 16, "global": False,
                                                                                    "redundancy": "flash"}},
        {"prompt": "p", "forced_output_tokens": [5, 6, 7], "return_forced_logprobs": True, "max_tokens": 3},
        {"prompt": "p", "kv_policy": "snapkv", "kv_budget": 64, "kv_policy_options": {"kernel": "7", "pool_type": "avg"}},
        {"prompt": "p", "kv_policy": "streaming", "kv_budget": 128, "top_k": -1, "seed": None},
    ]
    write("request_jsonl", "\n".join(json.dumps(r) for r in reqs), "all_fields")
    for i, r in enumerate(reqs):
        write("request_jsonl", json.dumps(r), f"request{i}")


# ------------------------------------------------------------------ OpenAI request bodies
def openai_request_seeds():
    bodies = {
        "completion": {"model": "origami-tiny-qwen3", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
        "completion_list": {"prompt": ["a", "b"], "n": 2, "best_of": 2, "seed": 3, "stop": ["\n", "END"],
                            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        "completion_ids": {"prompt": [[1, 2, 3], [4, 5]], "top_k": 40, "top_p": 0.9, "min_p": 0.05, "ignore_eos": True,
                           "stop_token_ids": [0, 2], "presence_penalty": 0, "logit_bias": {}, "echo": False},
        "completion_logprobs": {"prompt": "p", "logprobs": 5, "max_tokens": 4, "stream": True},
        "chat": {"model": "origami-tiny-qwen3", "messages": [{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "Hi!"}],
                 "max_completion_tokens": 8, "temperature": 0.7},
        "chat_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]},
                                    {"role": "assistant", "content": None}],
                       "chat_template_kwargs": {"enable_thinking": False}, "stop": "x"},
        "chat_logprobs": {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3,
                          "n": 2, "stream": True},
        "chat_logprobs_bad": {"messages": [{"role": "user", "content": "hi"}], "logprobs": False, "top_logprobs": 21},
        "kv_policy": {"prompt": "p", "messages": [{"role": "user", "content": "x"}], "kv_policy": "zipage",
                      "kv_budget": 512, "kv_policy_options": {"window": 16, "global": False, "redundancy": "flash"}},
        "kv_snapkv": {"prompt": "p", "kv_policy": "snapkv", "kv_budget": 64,
                      "kv_policy_options": {"kernel": "7", "pool_type": "avg"}},
    }
    for name, body in bodies.items():
        write("openai_request", json.dumps(body), name)


# ------------------------------------------------------------------ policy options
def policy_seeds():
    seeds = {
        "zipage_defaults": "zipage\n",
        "zipage_opts": "zipage\nwindow=16\nglobal=1\nredundancy=lightning\nspan=256\npool=first\npool_type=max",
        "zipage_attn": "zipage-attn\nwindow=8\nglobal=0",
        "zipage_flash": "zipage-flash\nredundancy=flash\nlambda=0.5\nalpha=0.5\ntau=0.9\nthreshold=0.8\nrecent=32\nkernel=5\nsinks=2",
        "snapkv": "snapkv\nwindow=32\nkernel=7\npool_type=avg\nsinks=4",
        "streaming": "streaming\nsinks=4",
        "full": "full\n",
        "bad": "zipage\nwindow\n=3\nwindow=abc\nunknown=1",
    }
    for name, text in seeds.items():
        write("policy_options", text, name)


if __name__ == "__main__":
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    request_seeds()
    openai_request_seeds()
    policy_seeds()
    for h in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, h))
        size = sum(os.path.getsize(os.path.join(OUT, h, f)) for f in files)
        print(f"{h}: {len(files)} seeds, {size} bytes")
