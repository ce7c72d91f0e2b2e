"""A short session of the official `openai` client against `host serve`, for
slow devices (the CUDA backend on the kernel emulator): a greedy chat with
log-probabilities and a seeded, filtered completion.

Usage: openai_smoke.py BASE_URL MODEL_NAME
Prints one JSON object with what came back.
"""

import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=6,
    temperature=0,
    logprobs=True,
    top_logprobs=3,
)
content = chat.choices[0].logprobs.content
assert len(content) == chat.usage.completion_tokens, content
for token in content:
    assert token.logprob <= 0.0
    assert len(token.top_logprobs) == 3
    assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob >= token.top_logprobs[2].logprob
    # Greedy: the chosen token is the most likely one.
    assert abs(token.top_logprobs[0].logprob - token.logprob) < 1e-6, token

sampled = client.completions.create(
    model=model,
    prompt="The capital of France is",
    max_tokens=6,
    temperature=0.8,
    top_p=0.9,
    seed=7,
    extra_body={"top_k": 40},
)
print(
    json.dumps(
        {
            "chat": chat.choices[0].message.content,
            "chat_logprobs": [t.logprob for t in content],
            "sampled": sampled.choices[0].text,
        }
    )
)
