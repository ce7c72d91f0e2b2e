#!/usr/bin/env python3
"""vLLM's scoring endpoints of `host serve` (/v1/score, /v1/rerank,
/v1/classify) through httpx and the official `cohere` client, checked against
transformers and sentence-transformers (tests/fixtures/reference/
tiny_rerankers.json, minilm_embeddings.json).

Usage: rerank_client.py BASE_URL MODEL KIND REFERENCE_JSON [NAME]
KIND: cross_encoder (the tiny BERT reranker, or the reference's model NAME:
tiny_qwen3_reranker, a decoder), classifier (the tiny three-label RoBERTa)
or bi_encoder (all-MiniLM-L6-v2).
Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import math
import sys

import httpx

BASE_URL, MODEL, KIND, REFERENCE = sys.argv[1:5]
NAME = sys.argv[5] if len(sys.argv) > 5 else "tiny_cross_encoder"
ROOT = BASE_URL.removesuffix("/v1")
ATOL = 1e-4
with open(REFERENCE, encoding="utf-8") as f:
    ref = json.load(f)
http = httpx.Client(timeout=60)


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def post(path, body, status=200):
    reply = http.post(ROOT + path, json=body)
    assert reply.status_code == status, (path, body, reply.status_code, reply.text)
    return reply.json()


def close(actual, expected, what):
    assert len(actual) == len(expected), (what, actual, expected)
    worst = max(abs(a - e) for a, e in zip(actual, expected))
    assert worst <= ATOL, (what, actual, expected)
    return worst


def refused(path, body, param, words):
    error = post(path, body, status=400)["error"]
    assert error["param"] == param, (path, body, error)
    assert words in error["message"], (path, body, error)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def softmax(xs):
    top = max(xs)
    exps = [math.exp(x - top) for x in xs]
    return [e / sum(exps) for e in exps]


def cross_encoder():
    model = ref["models"][NAME]
    inputs = {tuple(i["texts"]): i for i in model["inputs"]}
    query, documents = ref["query"], ref["documents"]
    expected = [o[0] for o in model["cross_encoder_outputs"][: len(documents)]]

    reply = post("/v1/score", {"model": MODEL, "text_1": query, "text_2": documents})
    assert reply["object"] == "list" and reply["model"] == MODEL, reply
    assert [d["index"] for d in reply["data"]] == list(range(len(documents)))
    worst = close([d["score"] for d in reply["data"]], expected, "score")
    tokens = sum(len(inputs[(query, d)]["ids"]) for d in documents)
    assert reply["usage"]["prompt_tokens"] == tokens == reply["usage"]["total_tokens"], reply["usage"]
    report("score_one_to_many", worst=worst, tokens=tokens)

    pairs = [p for p in inputs if len(p) == 2 and p[0] != query]
    reply = post("/score", {"text_1": [p[0] for p in pairs], "text_2": [p[1] for p in pairs]})
    close([d["score"] for d in reply["data"]], [sigmoid(inputs[p]["logits"][0]) for p in pairs], "pairs")
    report("score_pairs", pairs=len(pairs))

    reply = post("/v1/score", {"model": MODEL, "text_1": query, "text_2": documents, "use_activation": False})
    close([d["score"] for d in reply["data"]], [inputs[(query, d)]["logits"][0] for d in documents], "logits")
    report("raw_logits")

    # Pairs cut as transformers' `truncation=True, max_length=n` cuts them (longest first).
    for cut in model["truncated"]:
        if len(cut["texts"]) == 2:
            reply = post("/v1/score", {"text_1": cut["texts"][0], "text_2": cut["texts"][1], "truncate_prompt_tokens": cut["max_tokens"]})
            close([reply["data"][0]["score"]], [sigmoid(cut["logits"][0])], "truncated")
            assert reply["usage"]["prompt_tokens"] == cut["max_tokens"], reply
    long_query = " ".join([query] * 12)  # 84 tokens: every pair is cut to the 64 positions
    reply = post("/v1/rerank", {"query": long_query, "documents": documents, "truncate_prompt_tokens": -1})
    assert len(reply["results"]) == len(documents) and reply["usage"]["total_tokens"] == 64 * len(documents), reply
    refused("/v1/rerank", {"query": long_query, "documents": documents}, "input", "tokens")
    report("truncation")

    ranked = sorted(range(len(documents)), key=lambda i: -expected[i])
    reply = post("/v1/rerank", {"model": MODEL, "query": query, "documents": documents, "top_n": 3})
    assert [r["index"] for r in reply["results"]] == ranked[:3], (reply, ranked)
    close([r["relevance_score"] for r in reply["results"]], [expected[i] for i in ranked[:3]], "rerank")
    assert [r["document"]["text"] for r in reply["results"]] == [documents[i] for i in ranked[:3]]
    assert reply["usage"]["total_tokens"] == tokens and reply["id"].startswith("rerank-"), reply
    reply = post("/rerank", {"query": query, "documents": [{"text": d} for d in documents], "return_documents": False})
    assert [r["index"] for r in reply["results"]] == ranked and all("document" not in r for r in reply["results"])
    report("rerank", order=ranked)

    import cohere

    v1 = cohere.Client(base_url=ROOT, api_key="unused")
    reply = v1.rerank(model=MODEL, query=query, documents=documents, top_n=2)
    assert [r.index for r in reply.results] == ranked[:2], reply
    close([r.relevance_score for r in reply.results], [expected[i] for i in ranked[:2]], "cohere v1")
    report("cohere_v1")
    v2 = cohere.ClientV2(base_url=ROOT, api_key="unused")
    reply = v2.rerank(model=MODEL, query=query, documents=documents)
    assert [r.index for r in reply.results] == ranked, reply
    close([r.relevance_score for r in reply.results], [expected[i] for i in ranked], "cohere v2")
    report("cohere_v2")

    # Requests that arrive together share the worker's steps; each gets its own scores.
    from concurrent.futures import ThreadPoolExecutor

    def one(k):
        chosen = [documents[(k + j) % len(documents)] for j in range(1 + k % 4)]
        reply = post("/v1/score", {"text_1": query, "text_2": chosen})
        return close([d["score"] for d in reply["data"]], [expected[documents.index(d)] for d in chosen], k)

    with ThreadPoolExecutor(8) as pool:
        worst = max(pool.map(one, range(16)))
    report("concurrent", requests=16, worst=worst)

    texts = [i for i in model["inputs"] if len(i["texts"]) == 1]
    reply = post("/v1/classify", {"model": MODEL, "input": [t["texts"][0] for t in texts]})
    for item, text in zip(reply["data"], texts):
        close(item["probs"], [sigmoid(text["logits"][0])], "classify")
        assert item["label"] == "LABEL_0" and item["num_classes"] == 1, item
    report("classify")

    refused("/v1/rerank", {"query": query, "documents": documents, "max_tokens_per_doc": 8}, "max_tokens_per_doc", "max_tokens_per_doc")
    refused("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1", "`text_2` 3")
    refused("/v1/score", {"model": MODEL, "text_1": "a", "text_2": []}, "text_2", "got 0")
    # BERT's pair template adds 3 special tokens, the decoder's none.
    cuts = [(0, "-1 or positive"), (65, "64 tokens")]
    cuts += [(3, "3 special tokens")] if NAME == "tiny_cross_encoder" else []
    for k, words in cuts:
        refused("/v1/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": k}, "truncate_prompt_tokens", words)
    refused("/v1/score", {"text_1": "a " * 70, "text_2": "b"}, "input", "tokens")
    refused("/v1/embeddings", {"model": MODEL, "input": "a"}, "model", "sequence-classification")
    refused("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "model", "/v1/rerank")
    assert post("/v1/score", {"model": "other", "text_1": "a", "text_2": "b"}, status=404)["error"]
    refused("/v1/rerank", {"query": 1, "documents": ["a"]}, None, "invalid request")
    reply = http.post(ROOT + "/v1/rerank", content=b'{"query": "a", "documents": [', headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    report("errors")


def classifier():
    model = ref["models"]["tiny_roberta_classifier"]
    texts = [i for i in model["inputs"] if len(i["texts"]) == 1]
    reply = post("/v1/classify", {"model": MODEL, "input": [t["texts"][0] for t in texts]})
    assert reply["object"] == "list" and len(reply["data"]) == len(texts), reply
    for index, (item, text) in enumerate(zip(reply["data"], texts)):
        probs = softmax(text["logits"])
        close(item["probs"], probs, "classify")
        assert item["index"] == index and item["num_classes"] == 3, item
        assert item["label"] == model["labels"][probs.index(max(probs))], item
    assert reply["usage"]["prompt_tokens"] == sum(len(t["ids"]) for t in texts), reply
    reply = post("/classify", {"input": texts[0]["texts"][0], "use_activation": False})
    close(reply["data"][0]["probs"], texts[0]["logits"], "raw logits")
    cut = [c for c in model["truncated"] if len(c["texts"]) == 1][0]
    reply = post("/v1/classify", {"input": cut["texts"], "truncate_prompt_tokens": cut["max_tokens"]})
    close(reply["data"][0]["probs"], softmax(cut["logits"]), "truncated")
    report("classify")
    refused("/v1/score", {"text_1": "a", "text_2": "b"}, "model", "3 classes")
    refused("/v1/classify", {"input": "a", "temperature": 0.5}, "temperature", "temperature")
    report("errors")


def bi_encoder():
    sentences, embeddings = ref["sentences"], ref["embeddings"]

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    expected = [cosine(embeddings[0], embeddings[i]) for i in range(1, 8)]
    reply = post("/v1/score", {"model": MODEL, "text_1": sentences[0], "text_2": sentences[1:8]})
    close([d["score"] for d in reply["data"]], expected, "cosine")
    report("score_one_to_many")
    reply = post("/v1/rerank", {"query": sentences[0], "documents": sentences[1:8], "top_n": 2})
    best = sorted(range(7), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in reply["results"]] == best, (reply, best)
    report("rerank")
    refused("/v1/score", {"text_1": "a", "text_2": "b", "use_activation": True}, "use_activation", "cosine")
    refused("/v1/classify", {"input": "a"}, "model", "embedding model")
    report("errors")


{"cross_encoder": cross_encoder, "classifier": classifier, "bi_encoder": bi_encoder}[KIND]()
