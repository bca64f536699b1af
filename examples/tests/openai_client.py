"""The official `openai` Python client against `serve --http` (stories260K).

Run by `examples/tests/openai_client.rs`, which starts the server and passes
its base URL as the first argument. Every check is an assert; the script
prints one line per check and exits non-zero on the first failure.
"""

import sys

import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
MODEL = "stories260K"


def check(name, cond, detail=""):
    assert cond, f"{name}: {detail}"
    print(f"ok: {name}")


# Completions: the same seed gives the same text, streaming or not.
def complete(**kw):
    return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, **kw)


a = complete(temperature=0.9, seed=7)
b = complete(temperature=0.9, seed=7)
check("completions: same seed, same text", a.choices[0].text == b.choices[0].text and a.choices[0].text, a)
check("completions: usage", a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens, a.usage)
chunks = list(complete(temperature=0.9, seed=7, stream=True, stream_options={"include_usage": True}))
streamed = "".join(c.choices[0].text for c in chunks if c.choices)
check("completions: streamed text equals the whole", streamed == a.choices[0].text, (streamed, a.choices[0].text))
check("completions: the usage chunk", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == a.usage.completion_tokens, chunks[-1])
check("completions: finish reason", chunks[-2].choices[0].finish_reason == a.choices[0].finish_reason, chunks[-2])

# Chat (ChatML: the checkpoint has no template of its own).
def chat(**kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=16, **kw
    )


c = chat(temperature=0.7, seed=3)
d = chat(temperature=0.7, seed=3)
check("chat: same seed, same text", c.choices[0].message.content == d.choices[0].message.content, c)
check("chat: role", c.choices[0].message.role == "assistant", c)
parts = list(chat(temperature=0.7, seed=3, stream=True))
check("chat: streamed deltas equal the message", "".join(p.choices[0].delta.content or "" for p in parts) == c.choices[0].message.content, parts)
check("chat: first delta carries the role", parts[0].choices[0].delta.role == "assistant", parts[0])

# Logprobs in both shapes.
lp = complete(temperature=0, logprobs=3)
toks = lp.choices[0].logprobs.tokens
check("completions logprobs: tokens spell the text", "".join(toks) == lp.choices[0].text, toks)
check("completions logprobs: top 3 per token", all(len(t) == 3 for t in lp.choices[0].logprobs.top_logprobs), lp.choices[0].logprobs)
check("completions logprobs: greedy token is the top one", all(abs(max(t.values()) - l) < 1e-4 for t, l in zip(lp.choices[0].logprobs.top_logprobs, lp.choices[0].logprobs.token_logprobs)), lp.choices[0].logprobs)
cl = chat(temperature=0, logprobs=True, top_logprobs=2)
content = cl.choices[0].logprobs.content
check("chat logprobs: one entry per token, two alternatives", len(content) > 0 and all(len(e.top_logprobs) == 2 for e in content), content)
check("chat logprobs: values are log-probabilities", all(e.logprob <= 0 for e in content), content)

# Stop strings: one spanning two tokens of the greedy text.
full = lp.choices[0].text
k = next(i for i in range(2, len(toks) - 1) if len(toks[i]) >= 2 and len(toks[i + 1]) >= 2)
stop = toks[k][-1] + toks[k + 1][0]
s = complete(temperature=0, stop=[stop, "never appears"])
check("stop across two tokens", s.choices[0].text == full[: full.index(stop)] and s.choices[0].finish_reason == "stop", (stop, full, s))
ss = "".join(c.choices[0].text for c in complete(temperature=0, stop=stop, stream=True))
check("stop across two tokens, streamed", ss == s.choices[0].text, ss)

# A stop string of one multi-byte character: the bias and penalty make the
# model write "é" as its two byte tokens (<0xC3> = 198, <0xA9> = 172).
toml = """
[[stage]]
type = "logit_bias"
bias = { 198 = 100.0, 172 = 100.0 }
[[stage]]
type = "penalties"
last_n = 1
frequency = 500.0
[[stage]]
type = "greedy"
"""
raw = client.completions.create(model=MODEL, prompt="Once", max_tokens=8, extra_body={"sampler_chain": toml})
check("the biased chain writes é", raw.choices[0].text.startswith("é"), raw)
mb = client.completions.create(model=MODEL, prompt="Once", max_tokens=8, stop=["é"], extra_body={"sampler_chain": toml, "include_stop_str_in_output": True})
check("stop on a multi-byte character", mb.choices[0].text == "é" and mb.choices[0].finish_reason == "stop", mb)

# An invalid request: a 400 with OpenAI's error body.
try:
    complete(temperature=-1)
    check("invalid temperature refused", False)
except openai.BadRequestError as e:
    body = e.body if isinstance(e.body, dict) else {}
    check("invalid request: 400 with the param named", e.status_code == 400 and body.get("param") == "temperature" and body.get("type") == "invalid_request_error", e.body)

models = client.models.list()
check("models", [m.id for m in models.data] == [MODEL], models)
print("all checks passed")
