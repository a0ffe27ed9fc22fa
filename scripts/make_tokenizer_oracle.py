#!/usr/bin/env python3
"""scripts/make_tokenizer_oracle.py — expected answers for kvd's tokenizer test.

kvd's tokenizer (daemon/model/tokenizer*.c) is meant to give the same token
ids as llama.cpp. This script asks llama.cpp (through llama-cpp-python,
vocab_only) and writes the answers where tests/unit/test_tokenizer.c reads
them, in a line format C can parse without a JSON library:

    model <TAB> path                       the GGUF the following lines use
    tok   <TAB> label <TAB> hex(text) <TAB> ids(special=0) <TAB> ids(special=1)
    bytes <TAB> label <TAB> hex(text)      invalid UTF-8: round trip only
    chat  <TAB> label <TAB> add_generation_prompt <TAB> msgs <TAB> hex(rendering)

ids are space-separated decimals, "-" for none; msgs is "role=hex(content)"
joined by ";", "-" for none. Lines starting with '#' are comments.
Tokenization is always without BOS.

Outputs (all under tests/data/tokenizer/):
  smollm2_cases.txt   the default model, models/SmolLM2-135M-Instruct.Q4_1.gguf:
                      many varied strings, and chat renderings made with
                      jinja2 from the model's own tokenizer.chat_template
  tiny_*.gguf         small synthetic vocabularies written here: one
                      SentencePiece ("llama") vocabulary with scores and
                      <0xXX> byte tokens, one byte-level BPE vocabulary
                      under several pre-tokenizer names, and 4-token ones
                      carrying the Llama-3, Llama-2, Zephyr and Phi-3 chat
                      templates
  synthetic_cases.txt llama.cpp's answers for those, and jinja2's
                      renderings of the chat templates

Invalid UTF-8 gets no ids: llama.cpp replaces each invalid byte with U+FFFD
before tokenizing, while kvd keeps the byte (so decoding gives the input
back); the test checks the round trip for those.

With --archs it writes, instead, the files of the other model families
(leaving the ones above untouched):
  tiny_bpe_deepseek-llm.gguf, tiny_bpe_deepseek-coder.gguf
                      byte-level BPE vocabularies trained on the corpus and
                      on every case string (so merges cross the boundaries
                      the pre-tokenizer draws in any script), and
  tiny_chat_gemma.gguf Gemma's chat template
  archs_cases.txt     llama.cpp's answers and jinja2's renderings for those
  gemma3_cases.txt    the Gemma 3 270M file (scripts/setup --model
                      gemma3-270m): every case string, and the chat
                      renderings of Gemma's template, which the file itself
                      does not carry (kvd recognises Gemma by its
                      <start_of_turn> control tokens)

Needs: llama-cpp-python and jinja2 (e.g. a venv made with
`pip install llama-cpp-python jinja2`). Run from anywhere:
    /path/to/venv/bin/python scripts/make_tokenizer_oracle.py
"""
import collections
import os
import struct
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests/data/tokenizer")
MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"

# ---- the strings --------------------------------------------------------------

CASES = [
    ("empty", ""),
    ("space", " "),
    ("two-spaces", "  "),
    ("tab", "\t"),
    ("newline", "\n"),
    ("crlf", "\r\n"),
    ("hello", "Hello world"),
    ("hello-lead-space", " Hello world"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("prose", "It was the best of times, it was the worst of times, it was the age of wisdom, "
              "it was the age of foolishness..."),
    ("question", "Why is the sky blue? Explain it to a five-year-old, please!"),
    ("caps", "HELLO WORLD, THIS IS LOUD."),
    ("mixed-case", "camelCaseIdentifier and snake_case_name and SCREAMING_SNAKE"),
    ("digits", "0123456789"),
    ("long-number", "1234567"),
    ("numbers-in-text", "In 2024, 3.14159 people paid $1,234.56 for 42 items (about 7%)."),
    ("phone", "+1 (555) 010-9999 ext. 12"),
    ("date-time", "2024-11-29T09:30:00Z and 12:45 pm"),
    ("version", "v1.2.3-rc4+build.567"),
    ("huge-number", "98765432109876543210987654321"),
    ("spaces-run", "a     b"),
    ("spaces-trailing", "trailing spaces   "),
    ("spaces-leading", "   leading spaces"),
    ("tabs-mixed", "a\t\tb \t c\t"),
    ("newlines-mixed", "line one\nline two\n\nline four\n\n\n"),
    ("whitespace-zoo", " \t\n \r\n\t  \n  x  \n\t"),
    ("indent", "def f():\n    return 1\n\n\nclass A:\n\tpass\n"),
    ("python", "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("python-comprehension", "squares = [x**2 for x in range(10) if x % 2 == 0]  # even squares"),
    ("c-code", "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n"),
    ("c-pointer", "static inline int *p = &arr[i++]; x->y ^= ~z | (a << 3) >> 1;"),
    ("json", "{\"name\": \"kvd\", \"version\": 1, \"tags\": [\"llm\", \"cache\"], \"ok\": true, \"n\": null}"),
    ("shell", "cat /etc/passwd | grep -v '^#' | awk -F: '{print $1}' > users.txt 2>&1"),
    ("html", "<div class=\"x\"><a href='https://example.com/?q=1&r=2'>link</a></div>"),
    ("url-email", "Visit https://huggingface.co/HuggingFaceTB/SmolLM2-135M or mail me@example.org."),
    ("punct-run", "Wait... what?!?! -- no way!!! ***bold*** ___ ~~~ ==="),
    ("markdown", "# Title\n\n- item one\n- item **two**\n\n```python\nprint('hi')\n```\n"),
    ("contractions", "it's don't you're we've I'm they'll she'd"),
    ("contractions-upper", "IT'S DON'T YOU'RE WE'VE I'M THEY'LL SHE'D"),
    ("contractions-mixed", "It'S dOn'T You'Re We'Ve I'M They'Ll She'D"),
    ("contraction-edge", "'s 't 're 've 'm 'll 'd ' 'x 'sx 'lle rock'n'roll"),
    ("quotes", "\"double\" 'single' `back` \u201ccurly\u201d \u2018curly\u2019 \u00abguillemets\u00bb"),
    ("accents", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade co\u00f6perate"),
    ("accents-combining", "cafe\u0301 nai\u0308ve"),
    ("german", "Gr\u00fc\u00dfe aus M\u00fcnchen! Die Stra\u00dfe ist sch\u00f6n, \u00e4\u00f6\u00fc \u00c4\u00d6\u00dc."),
    ("french", "L'\u00e9t\u00e9 dernier, j'ai mang\u00e9 des cr\u00eapes \u00e0 l'h\u00f4tel o\u00f9 nous \u00e9tions."),
    ("spanish", "\u00bfD\u00f3nde est\u00e1 la biblioteca? \u00a1Ma\u00f1ana ser\u00e1 otro d\u00eda, se\u00f1or!"),
    ("russian", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430? "
                "\u042d\u0442\u043e \u0442\u0435\u0441\u0442 \u0442\u043e\u043a\u0435\u043d\u0438\u0437\u0430\u0442\u043e\u0440\u0430."),
    ("greek", "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5, "
              "\u03b1\u03b2\u03b3\u03b4\u03b5 \u03a9\u03bc\u03ad\u03b3\u03b1."),
    ("arabic", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! "
               "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0644\u063a\u0629 \u062c\u0645\u064a\u0644\u0629 \u0661\u0662\u0663."),
    ("hebrew", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"),
    ("hindi", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e! "
              "\u092f\u0939 \u090f\u0915 \u092a\u0930\u0940\u0915\u094d\u0937\u0923 \u0939\u0948\u0964 \u0967\u0968\u0969"),
    ("chinese", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002\u6211\u4eec\u53bb\u516c\u56ed\u5427\u3002"),
    ("japanese", "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57\u3002"),
    ("korean", "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8\uc785\ub2c8\ub2e4."),
    ("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e42\u0e25\u0e01"),
    ("emoji", "I love pizza \U0001F355 and cats \U0001F431!"),
    ("emoji-zwj", "Family: \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and \U0001F469\U0001F3FD\u200D\U0001F4BB"),
    ("emoji-flags", "Flags: \U0001F1FA\U0001F1F8 \U0001F1EF\U0001F1F5 \U0001F1E9\U0001F1EA \U0001F3F4\u200D\u2620\uFE0F"),
    ("emoji-only", "\U0001F600\U0001F601\U0001F602\U0001F923\U0001F60D"),
    ("emoji-skin", "\U0001F44D\U0001F3FB\U0001F44D\U0001F3FF \u2764\uFE0F \u270C\uFE0F"),
    ("math-symbols", "\u2200x \u2208 \u211d: x\u00b2 \u2265 0 \u21d2 \u221a(x\u00b2) = |x| \u2248 \u03c0 \u00d7 \u221e"),
    ("unicode-digits", "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13 \u2460\u2461\u2462 \u00bd \u2167 \u00b2"),
    ("fullwidth", "\uff28\uff45\uff4c\uff4c\uff4f\u3000\uff37\uff4f\uff52\uff4c\uff44\uff01"),
    ("nbsp-spaces", "a\u00a0b\u2003c\u3000d\u2009e\u202ff\u205fg"),
    ("nel-ls-ps", "a\u0085b\u2028c\u2029d"),
    ("zero-width", "zero\u200bwidth\u200cjoin\u200dhere\ufeffbom"),
    ("control-chars", "bell\x07 esc\x1b[31m red\x1b[0m del\x7f nul\x00 end"),
    # Bytes SmolLM2's vocabulary has no token for (0x04 0x06 0x13 0x14 0x16 0x1D, and the
    # lead bytes 0xF1 0xF2 of planes 4..11): llama.cpp drops them.
    ("unspellable-bytes", "ctl\x04\x06 x\x13\x14\x16\x1d y \U00040000 z \U0009FFFD."),
    ("special-im", "<|im_start|>user\nhi<|im_end|>"),
    ("special-chat", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                     "<|im_start|>assistant\n"),
    ("special-adjacent", "<|im_end|><|im_start|><|endoftext|>"),
    ("special-partial", "<|im_start <|im_end| <im_start|> <|IM_START|> <||>"),
    ("special-in-word", "abc<|endoftext|>def <repo_name>x<file_sep>y"),
    ("special-spaces", " <|im_start|> user <|im_end|> "),
    ("special-jupyter", "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>"),
    ("long-word", "Pneumonoultramicroscopicsilicovolcanoconiosis " * 3),
    ("very-long-word", "a" * 1000),
    ("very-long-mixed", "supercalifragilistic" * 50),
    ("repeated-spaces-long", " " * 300 + "x"),
    ("repeated-newlines", "\n" * 50),
    ("repeated-digits", "7" * 100),
    ("repeated-punct", "!" * 64 + "?" * 64),
    ("apostrophes-unicode", "don\u2019t it\u2019s I\u2019m"),
    ("mixed-scripts", "Hello\u4e16\u754cWorld\u041f\u0440\u0438\u0432\u0435\u0442123abc\u0645\u0631\u062d\u0628\u0627"),
    ("letters-digits", "abc123def456 x1y2z3 H2O CO2 4x4"),
    ("hex-and-bytes", "0xDEADBEEF 0b1010 1e-9 -0.5 +.5e+10"),
    ("chatml-like", "user\nHello\nassistant\n"),
    ("smollm-system", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    ("yaml", "key: value\nlist:\n  - a\n  - b\nnested:\n    deep: 1\n"),
    ("sql", "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC;"),
    ("rust", "fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!(\"{:?}\", v); }"),
    ("latex", "$$\\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}$$"),
    ("tab-separated", "id\tname\tscore\n1\talice\t9.5\n2\tbob\t7.25\n"),
    ("windows-lines", "one\r\ntwo\r\n\r\nthree\r"),
    ("space-before-punct", "hello , world . ( x ) [ y ] { z }"),
    ("space-newline", "a \nb  \n c\n \n"),
    ("ascii-all", "".join(chr(c) for c in range(32, 127))),
    ("latin1-all", "".join(chr(c) for c in range(0xA0, 0x100))),
]

INVALID = [
    ("invalid-ff", b"a\xff\xfeb"),
    ("invalid-lone-cont", b"x\x80\xbfy"),
    ("invalid-truncated", b"caf\xc3 ok \xe2\x82"),
    ("invalid-overlong", b"\xc0\xaf\xe0\x80\xaf slash"),
    ("invalid-surrogate", b"\xed\xa0\x80\xed\xbf\xbf"),
    ("invalid-mixed", b"Hello \xf0\x9f\x98 world \xf8\x88\x80\x80\x80 end"),
]

# Strings for the synthetic vocabularies.
TINY_CASES = [c for c in CASES if c[0] in (
    "empty", "space", "two-spaces", "newline", "crlf", "hello", "hello-lead-space", "sentence",
    "caps", "digits", "long-number", "numbers-in-text", "spaces-run", "spaces-trailing",
    "spaces-leading", "tabs-mixed", "newlines-mixed", "whitespace-zoo", "indent", "python",
    "c-code", "punct-run", "contractions", "contractions-upper", "contractions-mixed",
    "contraction-edge", "accents", "accents-combining", "german", "russian", "chinese", "emoji",
    "emoji-zwj", "unicode-digits", "nbsp-spaces", "nel-ls-ps", "special-im", "special-in-word",
    "special-spaces", "letters-digits", "hex-and-bytes", "space-before-punct", "space-newline",
    "windows-lines", "ascii-all", "latin1-all", "math-symbols", "very-long-word",
    "repeated-digits", "repeated-spaces-long", "shell",
)] + [
    ("user-token", "call <tool> now<tool><tool>x"),
    ("spm-edge", "  hello  world  "),
    ("spm-newline", "hello\nworld\n"),
]

CHATS = [
    ("user-only", True, [("user", "Hi there!")]),
    ("user-only-no-prompt", False, [("user", "Hi there!")]),
    ("with-system", True, [("system", "You are a pirate."), ("user", "Where is the treasure?")]),
    ("multi-turn", True, [("user", "What is 2+2?"), ("assistant", "4"), ("user", "And 3+3?")]),
    ("system-multi-turn", False, [("system", "Be brief."), ("user", "Hello"), ("assistant", "Hi."),
                                  ("user", "Bye\nnow"), ("assistant", "Goodbye! \U0001F44B")]),
    ("assistant-first", True, [("assistant", "I start."), ("user", "ok")]),
    ("empty", True, []),
    ("unicode", True, [("user", "Caf\u00e9? \u4f60\u597d \u041f\u0440\u0438\u0432\u0435\u0442 <b>bold</b>")]),
]

# Reference chat templates of the other families kvd_chat_render knows, as
# their models ship them; each goes into a small GGUF (with the family's BOS
# and EOS texts) and is rendered with jinja2 like the SmolLM2 one.
CHAT_TEMPLATES = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>",
               "{% set loop_messages = messages %}{% for message in loop_messages %}"
               "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
               "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
               "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "llama2": ("<s>", "</s>",
               "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
               "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
               "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
               "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
               "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
               "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
               "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
               "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
    "zephyr": ("<s>", "</s>",
               "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
               "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
               "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
               "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
               "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"),
    "phi3": ("<s>", "<|endoftext|>",
             "{% for message in messages %}{% if message['role'] == 'system' %}"
             "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
             "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
             "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"),
}

# Gemma 3's chat template (text-only form): a leading system message becomes
# the prefix of the first user turn; the assistant's role is "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}")
GEMMA_MODEL = "models/gemma-3-270m-q4_k_m.gguf"

# ---- helpers ------------------------------------------------------------------------


def hexs(b):
    return b.hex() if b else "-"


def ids_str(ids):
    return " ".join(str(i) for i in ids) if ids else "-"


def load(path):
    return Llama(model_path=path, vocab_only=True, verbose=False)


def chat_lines(tmpl, bos, eos):
    """Render CHATS with a template as transformers' apply_chat_template does
    (sandboxed jinja2, trim_blocks, lstrip_blocks), minus a leading BOS text:
    kvd leaves the first BOS to the tokenizer."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise ValueError(msg)

    env.globals["raise_exception"] = raise_exception
    template = env.from_string(tmpl)
    lines = []
    for label, agp, msgs in CHATS:
        try:
            rendered = template.render(messages=[{"role": r, "content": c} for r, c in msgs],
                                       add_generation_prompt=agp, bos_token=bos, eos_token=eos)
        except (ValueError, jinja2.exceptions.UndefinedError):
            continue  # the template refuses this conversation
        if bos and rendered.startswith(bos):
            rendered = rendered[len(bos):]
        m = ";".join("%s=%s" % (r, hexs(c.encode("utf-8"))) for r, c in msgs) or "-"
        lines.append("chat\t%s\t%d\t%s\t%s" % (label, 1 if agp else 0, m, hexs(rendered.encode("utf-8"))))
    return lines


def make_chat_gguf(family, bos, eos, tmpl):
    kvs = [
        ("tokenizer.ggml.model", T_STR, "gpt2"),
        ("tokenizer.ggml.pre", T_STR, "gpt-2"),
        ("tokenizer.ggml.tokens", (T_ARR, T_STR), [bos, eos, "a", "b"]),
        ("tokenizer.ggml.token_type", (T_ARR, T_I32), [3, 3, 1, 1]),
        ("tokenizer.ggml.merges", (T_ARR, T_STR), []),
        ("tokenizer.ggml.bos_token_id", T_U32, 0),
        ("tokenizer.ggml.eos_token_id", T_U32, 1),
        ("tokenizer.chat_template", T_STR, tmpl),
    ]
    path = "tests/data/tokenizer/tiny_chat_%s.gguf" % family
    write_gguf(os.path.join(ROOT, path), kvs)
    return path


def tok_lines(llm, cases):
    lines = []
    for label, text in cases:
        b = text.encode("utf-8")
        plain = llm.tokenize(b, add_bos=False, special=False)
        special = llm.tokenize(b, add_bos=False, special=True)
        # Check the oracle's own round trip, so a case it cannot represent is noticed.
        back = llm.detokenize(plain).decode("utf-8", errors="replace")
        if back != text:
            print("note: llama.cpp does not round-trip %r: %r" % (label, back[:60]), file=sys.stderr)
        lines.append("tok\t%s\t%s\t%s\t%s" % (label, hexs(b), ids_str(plain), ids_str(special)))
    return lines


# ---- a minimal GGUF writer (metadata only) ----------------------------------------

T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _val(t, v):
    if t == T_U32:
        return struct.pack("<I", v)
    if t == T_I32:
        return struct.pack("<i", v)
    if t == T_F32:
        return struct.pack("<f", v)
    if t == T_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if t == T_STR:
        return _str(v)
    raise ValueError(t)


def write_gguf(path, kvs):
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)))
    for key, t, v in kvs:
        out += _str(key)
        if isinstance(t, tuple):  # (T_ARR, element type)
            out += struct.pack("<IIQ", T_ARR, t[1], len(v))
            for e in v:
                out += _val(t[1], e)
        else:
            out += struct.pack("<I", t) + _val(t, v)
    while len(out) % 32:
        out += b"\0"
    with open(path, "wb") as f:
        f.write(out)


def llama_hparams():
    return [
        ("general.architecture", T_STR, "llama"),
        ("general.name", T_STR, "kvd tiny tokenizer test vocabulary"),
        ("llama.context_length", T_U32, 256),
        ("llama.embedding_length", T_U32, 64),
        ("llama.block_count", T_U32, 1),
        ("llama.feed_forward_length", T_U32, 128),
        ("llama.attention.head_count", T_U32, 4),
        ("llama.attention.head_count_kv", T_U32, 4),
        ("llama.rope.dimension_count", T_U32, 16),
        ("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-5),
    ]


CORPUS = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.
It's a test, isn't it? They'll say we've done what they'd want, and I'm sure you're right.
Hello world! Hello there, world. hello hello HELLO.
In 2024 there were 1234567 tokens, 42 models and 3.14 pies. 100 200 300 1000 2000.
def main():
    return 0
    if x == 1:
        print("hello world")


int main(void) { return 0; }
    spaces    and		tabs
newlines

everywhere
"""


def train_bpe(sequences, n_merges):
    """Greedy BPE over lists of symbols: most frequent adjacent pair first,
    ties broken by the pair's text. Returns the merges in order."""
    seqs = [list(s) for s in sequences]
    merges = []
    for _ in range(n_merges):
        counts = collections.Counter()
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] += 1
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        for i, s in enumerate(seqs):
            j, out = 0, []
            while j < len(s):
                if j + 1 < len(s) and s[j] == best[0] and s[j + 1] == best[1]:
                    out.append(joined)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
    return merges


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_tiny_bpe(pre, rich=False):
    """rich: merges also trained on every case string, 800 of them."""
    b2u = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]
    types = [3, 3, 3, 4]
    for b in range(256):
        tokens.append(b2u[b])
        types.append(1)
    text = CORPUS + ("".join(t for _, t in CASES) if rich else "")
    seqs = ["".join(b2u[c] for c in line.encode("utf-8")) for line in text.splitlines(keepends=True)]
    merges = train_bpe(seqs, 800 if rich else 300)
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
    kvs = llama_hparams() + [
        ("tokenizer.ggml.model", T_STR, "gpt2"),
        ("tokenizer.ggml.pre", T_STR, pre),
        ("tokenizer.ggml.tokens", (T_ARR, T_STR), tokens),
        ("tokenizer.ggml.token_type", (T_ARR, T_I32), types),
        ("tokenizer.ggml.merges", (T_ARR, T_STR), ["%s %s" % m for m in merges]),
        ("tokenizer.ggml.bos_token_id", T_U32, 0),
        ("tokenizer.ggml.eos_token_id", T_U32, 0),
        ("tokenizer.ggml.add_bos_token", T_BOOL, False),
    ]
    path = "tests/data/tokenizer/tiny_bpe_%s.gguf" % pre
    write_gguf(os.path.join(ROOT, path), kvs)
    return path


def make_tiny_spm():
    sp = "\u2581"
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        types.append(6)
        scores.append(0.0)
    tokens.append("<tool>")
    types.append(4)
    scores.append(0.0)
    # Single characters of the corpus (not all bytes: others fall back to <0xXX>).
    text = CORPUS.replace(" ", sp)
    chars = sorted(set(text) - {"\n", "\t"})
    for i, ch in enumerate(chars):
        tokens.append(ch)
        types.append(1)
        scores.append(-1000.0 - i)
    seqs = [(sp + line).replace(" ", sp) for line in CORPUS.splitlines()]
    for rank, (a, b) in enumerate(train_bpe(seqs, 250)):
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
            scores.append(-float(rank))
    kvs = llama_hparams() + [
        ("tokenizer.ggml.model", T_STR, "llama"),
        ("tokenizer.ggml.tokens", (T_ARR, T_STR), tokens),
        ("tokenizer.ggml.scores", (T_ARR, T_F32), scores),
        ("tokenizer.ggml.token_type", (T_ARR, T_I32), types),
        ("tokenizer.ggml.bos_token_id", T_U32, 1),
        ("tokenizer.ggml.eos_token_id", T_U32, 2),
        ("tokenizer.ggml.unknown_token_id", T_U32, 0),
    ]
    path = "tests/data/tokenizer/tiny_spm.gguf"
    write_gguf(os.path.join(ROOT, path), kvs)
    return path


# ---- main ----------------------------------------------------------------------------


def main_archs(header):
    lines = list(header)
    for pre in ("deepseek-llm", "deepseek-coder"):
        path = make_tiny_bpe(pre, rich=True)
        lines.append("model\t" + path)
        lines += tok_lines(load(path), CASES + TINY_CASES[-3:])
    lines.append("model\t" + make_chat_gguf("gemma", "<bos>", "<eos>", GEMMA_TEMPLATE))
    lines += chat_lines(GEMMA_TEMPLATE, "<bos>", "<eos>")
    with open(os.path.join(OUT_DIR, "archs_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("archs_cases.txt: %d tok, %d chat" % (sum(l.startswith("tok\t") for l in lines),
                                               sum(l.startswith("chat\t") for l in lines)))
    if not os.path.exists(GEMMA_MODEL):
        print("gemma3_cases.txt not written: %s is missing (scripts/setup --model gemma3-270m)" % GEMMA_MODEL)
        return
    llm = load(GEMMA_MODEL)
    lines = header + ["model\t" + GEMMA_MODEL] + tok_lines(llm, CASES + TINY_CASES[-3:])
    for line in chat_lines(GEMMA_TEMPLATE, "<bos>", "<eos>"):
        lines.append(line)
        lines += tok_lines(llm, [("chat-" + line.split("\t")[1], bytes.fromhex(line.split("\t")[4]).decode())])
    with open(os.path.join(OUT_DIR, "gemma3_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("gemma3_cases.txt: %d tok, %d chat" % (sum(l.startswith("tok\t") for l in lines),
                                                sum(l.startswith("chat\t") for l in lines)))


def main():
    os.chdir(ROOT)
    os.makedirs(OUT_DIR, exist_ok=True)
    header = ["# Generated by scripts/make_tokenizer_oracle.py; do not edit.",
              "# Oracle: llama.cpp through llama-cpp-python (vocab_only), chat renderings by jinja2."]
    if "--archs" in sys.argv[1:]:
        return main_archs(header)

    llm = load(MODEL)
    lines = header + ["model\t" + MODEL] + tok_lines(llm, CASES)
    for label, b in INVALID:
        lines.append("bytes\t%s\t%s" % (label, hexs(b)))
    # SmolLM2's template uses neither bos_token nor eos_token.
    for line in chat_lines(llm.metadata["tokenizer.chat_template"], "", "<|im_end|>"):
        lines.append(line)
        # The rendering is also a tokenization case.
        lines += tok_lines(llm, [("chat-" + line.split("\t")[1], bytes.fromhex(line.split("\t")[4]).decode())])
    with open(os.path.join(OUT_DIR, "smollm2_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("smollm2_cases.txt: %d tok, %d bytes, %d chat" % (
        sum(l.startswith("tok\t") for l in lines), len(INVALID), len(CHATS)))

    lines = list(header)
    for path in [make_tiny_spm()] + [make_tiny_bpe(p) for p in ("smollm", "llama-bpe", "gpt-2", "default", "qwen2")]:
        lines.append("model\t" + path)
        lines += tok_lines(load(path), TINY_CASES)
    for family, (bos, eos, tmpl) in CHAT_TEMPLATES.items():
        lines.append("model\t" + make_chat_gguf(family, bos, eos, tmpl))
        lines += chat_lines(tmpl, bos, eos)
    with open(os.path.join(OUT_DIR, "synthetic_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("synthetic_cases.txt: %d tok, %d chat" % (sum(l.startswith("tok\t") for l in lines),
                                                    sum(l.startswith("chat\t") for l in lines)))


if __name__ == "__main__":
    main()
