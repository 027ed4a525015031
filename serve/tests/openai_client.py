"""The `openai` Python package against a running `hetsched serve`: prints one JSON object
of what it got (the Rust test `real_clients` checks it). Arguments: BASE_URL MODEL_ID."""

import json
import sys

from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
chat = [{"role": "user", "content": "What is the capital of France?"}]
out = {}

answer = client.chat.completions.create(model=model, messages=chat, max_tokens=8, temperature=0)
out["chat"] = answer.choices[0].message.content
out["chat_finish"] = answer.choices[0].finish_reason
out["chat_completion_tokens"] = answer.usage.completion_tokens
stream = client.chat.completions.create(
    model=model, messages=chat, max_tokens=8, temperature=0, stream=True
)
out["chat_stream"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

prompt = "The capital of France is"
answer = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
out["completion"] = answer.choices[0].text
stream = client.completions.create(
    model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True
)
out["completion_stream"] = "".join(c.choices[0].text for c in stream if c.choices)

answer = client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=4, n=2, temperature=1.0, seed=5
)
out["n"] = sorted((c.index, c.text) for c in answer.choices)

# Cancel by closing a stream after two chunks.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Tell me a long story."}],
    max_tokens=400,
    stream=True,
)
seen = 0
for _ in stream:
    seen += 1
    if seen == 2:
        break
stream.close()
out["closed_after_chunks"] = seen

try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    out["unknown_model"] = None
except Exception as e:  # the package's NotFoundError
    out["unknown_model"] = getattr(e, "status_code", str(e))
print(json.dumps(out))
