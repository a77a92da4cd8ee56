#!/usr/bin/env python3
"""Renders every template in templates.json with every case in cases.json using Python
jinja2 configured as transformers' apply_chat_template does (chat_template_utils.py:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a {% generation %} tag, a tojson filter that is json.dumps(ensure_ascii=False),
and the globals raise_exception and strftime_now; render(messages=..., tools=None,
documents=None, add_generation_prompt=..., bos_token=..., eos_token=..., **extra)).

Writes expected/<template>.<case>.txt (the rendered text, byte for byte) or
expected/<template>.<case>.error (a JSON object: the exception type and message) for
renders that raise. The C++ test tests/unit/tokenizer/chat_template_test.cc renders the same
with polykv's engine and compares.

  render_golden.py            rewrite the expected files
  render_golden.py --check    compare with the committed files; exit 1 on a difference,
                              77 (skipped) when jinja2 >= 3.1 is not installed
"""
import json
import os
import sys
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
# Pinned so that templates calling strftime_now (Llama-3.2) do not depend on today's date.
DEFAULT_DATE_STRING = "26 Jul 2024"


def make_env():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its
        # body (it also records the span, which does not change the text).
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(
                lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_all():
    env = make_env()
    with open(os.path.join(HERE, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)
    with open(os.path.join(HERE, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    out = {}
    for t in templates:
        with open(os.path.join(HERE, t["file"]), encoding="utf-8", newline="") as f:
            source = f.read()
        compiled = env.from_string(source)
        stem = t["file"].rsplit(".jinja", 1)[0]
        for case in cases:
            extra = {"date_string": DEFAULT_DATE_STRING}
            extra.update(case.get("extra", {}))
            kwargs = {"tools": None, "documents": None}
            kwargs.update(extra)
            try:
                text = compiled.render(messages=case["messages"],
                                       add_generation_prompt=case["add_generation_prompt"],
                                       bos_token=t["bos_token"], eos_token=t["eos_token"],
                                       **kwargs)
                out[f"{stem}.{case['name']}.txt"] = text.encode("utf-8")
            except Exception as e:  # the template refused these messages
                err = {"type": type(e).__name__, "message": str(e)}
                out[f"{stem}.{case['name']}.error"] = (json.dumps(err, ensure_ascii=False) +
                                                       "\n").encode("utf-8")
    return out


def main():
    check = "--check" in sys.argv[1:]
    try:
        import jinja2
    except ImportError:
        print("SKIP: python3 has no jinja2 (pip install 'jinja2>=3.1')")
        return 77 if check else 1
    if tuple(int(x) for x in jinja2.__version__.split(".")[:2]) < (3, 1):
        print(f"SKIP: jinja2 {jinja2.__version__} is older than 3.1")
        return 77 if check else 1
    rendered = render_all()
    exp_dir = os.path.join(HERE, "expected")
    if not check:
        os.makedirs(exp_dir, exist_ok=True)
        for name in os.listdir(exp_dir):
            os.remove(os.path.join(exp_dir, name))
        for name, data in sorted(rendered.items()):
            with open(os.path.join(exp_dir, name), "wb") as f:
                f.write(data)
        print(f"wrote {len(rendered)} files to {exp_dir} (jinja2 {jinja2.__version__})")
        return 0
    bad = 0
    committed = set(os.listdir(exp_dir)) if os.path.isdir(exp_dir) else set()
    for name, data in sorted(rendered.items()):
        path = os.path.join(exp_dir, name)
        if name not in committed:
            print(f"MISSING {name}")
            bad += 1
            continue
        with open(path, "rb") as f:
            if f.read() != data:
                print(f"DIFFERS {name}")
                bad += 1
    for name in sorted(committed - set(rendered)):
        print(f"STALE {name}")
        bad += 1
    print(f"{len(rendered)} renders with jinja2 {jinja2.__version__}: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
