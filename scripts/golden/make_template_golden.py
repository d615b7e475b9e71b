#!/usr/bin/env python3
"""Chat-template goldens for the hybrid and recurrent families: each vendored template of
fixtures/templates/ rendered by Jinja2 the way Hugging Face's `apply_chat_template` renders it
(a sandboxed environment with trim_blocks and lstrip_blocks, the loopcontrols extension, a
`tojson` filter that keeps non-ASCII, `raise_exception`, `tools` none), on a few
conversations. Writes fixtures/golden/templates.json; loader/tests/templates.rs renders the
same with mollm's minijinja environment and compares the text byte for byte.

Usage: python3 scripts/golden/make_template_golden.py   (needs jinja2 from PyPI)
"""
import json
import pathlib

import jinja2
import jinja2.ext
import jinja2.sandbox

ROOT = pathlib.Path(__file__).resolve().parents[2]

# (template file, family it serves, bos_token, eos_token) as the GGUF files carry them.
TEMPLATES = [
    ("Qwen3.5-4B.jinja", "qwen35, qwen35moe", "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3next (Qwen3's template)", "", "<|im_end|>"),
    ("LFM2.5-Instruct.jinja", "lfm2", "<|startoftext|>", "<|im_end|>"),
    ("LFM2-8B-A1B.jinja", "lfm2moe", "<|startoftext|>", "<|im_end|>"),
    ("llama-cpp-rwkv-world.jinja", "rwkv7", "", "\n\n"),
]

CONVERSATIONS = [
    ("one question", [{"role": "user", "content": "What is 2+2?"}], True),
    (
        "system and two turns",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "  Name a prime. \n"},
        ],
        True,
    ),
    (
        "past thinking",
        [
            {"role": "user", "content": "Think, then answer: 3*3?"},
            {"role": "assistant", "content": "<think>\nthree threes\n</think>\n\n9"},
            {"role": "user", "content": "And 4*4? Ünïcödé ✓"},
        ],
        True,
    ),
    (
        "no generation prompt",
        [
            {"role": "user", "content": "Say yes."},
            {"role": "assistant", "content": "Yes."},
        ],
        False,
    ),
]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def env():
    e = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    return e


def main():
    cases = []
    for name, family, bos, eos in TEMPLATES:
        src = (ROOT / "fixtures/templates" / name).read_text()
        t = env().from_string(src)
        for title, messages, gen in CONVERSATIONS:
            text = t.render(
                messages=messages,
                tools=None,
                add_generation_prompt=gen,
                bos_token=bos,
                eos_token=eos,
            )
            cases.append(
                {
                    "template": name,
                    "family": family,
                    "bos_token": bos,
                    "eos_token": eos,
                    "conversation": title,
                    "messages": messages,
                    "add_generation_prompt": gen,
                    "text": text,
                }
            )
    out = {
        "made_by": "scripts/golden/make_template_golden.py with jinja2 " + jinja2.__version__,
        "cases": cases,
    }
    path = ROOT / "fixtures/golden/templates.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(cases)} renderings")


if __name__ == "__main__":
    main()
