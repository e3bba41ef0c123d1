"""kiln serve driven by the official openai and anthropic Python SDKs.

The model is testdata/tiny-tools: constructed weights whose greedy replies are known (see
testdata/FIXTURES.md); golden.json holds what Hugging Face transformers renders, tokenizes and
generates for each case, and the tests compare kiln's responses with it.
Run: KILN=build/bin/kiln python -m unittest tests/serve/test_sdk.py   (openai, anthropic installed)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import anthropic
import openai

sys.path.insert(0, os.path.dirname(__file__))
from kiln_server import KilnServer  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "testdata", "tiny-tools")
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "bin", "kiln"))
KEY = "sk-test-0123456789"
T0 = {"temperature": 0}  # the anthropic SDK has no sampling arguments: they go in the body
with open(os.path.join(MODEL, "golden.json")) as f:
    GOLDEN = json.load(f)
CASES = {c["name"]: c for c in GOLDEN["cases"]}
GREETING = GOLDEN["replies"]["greeting"]
WEATHER = GOLDEN["replies"]["weather"]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name."}},
                   "required": ["city"]}}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Get the current weather in a city.",
                  "input_schema": WEATHER_TOOL["function"]["parameters"]}


def openai_messages(case):
    """A golden case's messages as an OpenAI client sends them (tool-call arguments as JSON text)."""
    out = []
    for m in case["messages"]:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


class ServeSdkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KilnServer(KILN, MODEL, "--api-key", KEY)
        cls.oai = openai.OpenAI(base_url=cls.server.url + "/v1", api_key=KEY, max_retries=0)
        cls.ant = anthropic.Anthropic(base_url=cls.server.url, api_key=KEY, max_retries=0)
        cls.model = cls.server.model_name

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"kiln serve exited {code} on SIGTERM:\n" + cls.server.read_log()[-3000:])

    # ---------------------------------------------------------------- OpenAI chat
    def chat(self, case, **kw):
        return self.oai.chat.completions.create(model=self.model, messages=openai_messages(CASES[case]),
                                                temperature=0, **kw)

    def test_models(self):
        models = self.oai.models.list()
        self.assertEqual([m.id for m in models.data], ["tiny-tools"])

    def test_chat_matches_transformers(self):
        for name in ("chat", "chat_system", "chat_multi_turn"):
            r = self.chat(name)
            self.assertEqual(r.choices[0].message.content, CASES[name]["completion_text"], name)
            self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertEqual(r.usage.prompt_tokens, CASES[name]["prompt_tokens"], name)
            self.assertEqual(r.usage.completion_tokens, CASES[name]["completion_tokens"], name)
            self.assertEqual(r.system_fingerprint, "kiln")

    def test_chat_stream_with_usage(self):
        stream = self.chat("chat", stream=True, stream_options={"include_usage": True})
        text, finish, usage, roles = "", None, None, 0
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                roles += c.delta.role == "assistant"
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(text, GREETING)
        self.assertEqual(finish, "stop")
        self.assertEqual(roles, 1)
        self.assertEqual(usage.prompt_tokens, CASES["chat"]["prompt_tokens"])
        self.assertEqual(usage.completion_tokens, CASES["chat"]["completion_tokens"])

    def test_logprobs_match_transformers(self):
        # Raw-model log-probabilities of the generated tokens (fp32, transformers), as OpenAI reports them.
        r = self.oai.chat.completions.create(model=self.model, messages=openai_messages(CASES["chat"]), temperature=1,
                                             seed=3, logprobs=True, top_logprobs=3, max_tokens=1)
        first = r.choices[0].logprobs.content[0]
        self.assertEqual(first.token, "Hello")
        self.assertAlmostEqual(first.logprob, CASES["chat"]["token_logprobs"][0], places=4)
        self.assertEqual(len(first.top_logprobs), 3)
        self.assertEqual(first.top_logprobs[0].token, "Hello")
        self.assertEqual(bytes(first.bytes), b"Hello")
        r = self.chat("chat", logprobs=True)
        lps = [t.logprob for t in r.choices[0].logprobs.content]
        self.assertEqual(len(lps), CASES["chat"]["completion_tokens"])
        for got, want in zip(lps, CASES["chat"]["token_logprobs"]):
            self.assertAlmostEqual(got, want, places=4)

    def test_n_and_seed(self):
        kw = dict(model=self.model, messages=openai_messages(CASES["chat"]), temperature=2.0, max_tokens=12)
        a = self.oai.chat.completions.create(seed=11, n=3, **kw)
        b = self.oai.chat.completions.create(seed=11, n=3, **kw)
        self.assertEqual(len(a.choices), 3)
        self.assertEqual([c.message.content for c in a.choices], [c.message.content for c in b.choices])
        self.assertEqual([c.index for c in a.choices], [0, 1, 2])
        self.assertEqual(a.usage.prompt_tokens, CASES["chat"]["prompt_tokens"])  # the prompt counts once

    def test_structured_output(self):
        # response_format json_schema: every choice (greedy, sampled, streamed) is a JSON object of
        # the schema, checked field by field.
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "sunny": {"type": "boolean"},
                                                   "days": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
                  "required": ["city", "sunny"]}
        rf = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}
        kw = dict(model=self.model, messages=openai_messages(CASES["chat"]), max_tokens=400, response_format=rf)

        def check(text):
            v = json.loads(text)
            self.assertIsInstance(v, dict, text)
            self.assertLessEqual(set(v), {"city", "sunny", "days"}, text)
            self.assertIsInstance(v["city"], str, text)
            self.assertLessEqual(len(v["city"]), 12, text)
            self.assertIsInstance(v["sunny"], bool, text)
            if "days" in v:
                self.assertLessEqual(len(v["days"]), 3, text)
                self.assertTrue(all(isinstance(d, int) and not isinstance(d, bool) for d in v["days"]), text)

        greedy = self.oai.chat.completions.create(temperature=0, **kw)
        self.assertEqual(greedy.choices[0].finish_reason, "stop")
        check(greedy.choices[0].message.content)
        sampled = self.oai.chat.completions.create(temperature=1.0, seed=5, n=3, **kw)
        for c in sampled.choices:
            if c.finish_reason == "stop":
                check(c.message.content)
        text = "".join(c.choices[0].delta.content or ""
                       for c in self.oai.chat.completions.create(stream=True, temperature=0, **kw) if c.choices)
        self.assertEqual(text, greedy.choices[0].message.content)
        # Anthropic's output_config.format (extra_body: older SDKs lack the field), stop reason end_turn.
        m = self.ant.messages.create(model=self.model, max_tokens=400, messages=[{"role": "user", "content": "Hi!"}],
                                     extra_body=dict(T0, output_config={"format": {"type": "json_schema", "schema": schema}}))
        self.assertEqual(m.stop_reason, "end_turn")
        self.assertEqual(m.content[0].text, greedy.choices[0].message.content)  # the same prompt, greedy
        check(m.content[0].text)
        obj = self.oai.chat.completions.create(model=self.model, messages=openai_messages(CASES["chat"]),
                                               max_tokens=400, response_format={"type": "json_object"})
        if obj.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(obj.choices[0].message.content), dict)

    def test_max_tokens_length(self):
        for kw in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
            r = self.chat("chat", **kw)
            self.assertEqual(r.choices[0].message.content, "Hello! How")
            self.assertEqual(r.choices[0].finish_reason, "length")
            self.assertEqual(r.usage.completion_tokens, 3)

    def test_stop_sequences_both_protocols(self):
        r = self.chat("chat", stop=[" can", "zzz"])
        self.assertEqual(r.choices[0].message.content, "Hello! How")
        self.assertEqual(r.choices[0].finish_reason, "stop")
        text = "".join(c.choices[0].delta.content or "" for c in self.chat("chat", stop=" can", stream=True) if c.choices)
        self.assertEqual(text, "Hello! How")
        m = self.ant.messages.create(model=self.model, max_tokens=50, extra_body=T0, stop_sequences=[" can"],
                                     messages=[{"role": "user", "content": "Hi!"}])
        self.assertEqual(m.content[0].text, "Hello! How")
        self.assertEqual(m.stop_reason, "stop_sequence")
        self.assertEqual(m.stop_sequence, " can")
        with self.ant.messages.stream(model=self.model, max_tokens=50, extra_body=T0, stop_sequences=["you"],
                                      messages=[{"role": "user", "content": "Hi!"}]) as s:
            self.assertEqual("".join(s.text_stream), "Hello! How can I help ")
            final = s.get_final_message()
        self.assertEqual(final.stop_sequence, "you")

    # ---------------------------------------------------------------- sampling parameters
    def test_sampling_cuts_to_one_token_are_greedy(self):
        # At temperature 2 tiny-tools' first token is "Hello" with p ~ 0.9 (logits 20, 14, 14 and 0 for the
        # rest, halved) and every later token has p ~ 0.987, so 16 seeded samples of 10 tokens stray from
        # the greedy reply. top_k=1, min_p=1 (keep p >= max p), min_p=0.5 and top_p=0.5 (the top token
        # alone holds >= 0.5 at every step) each keep only the most likely token: the greedy reply,
        # whatever the seed.
        kw = dict(model=self.model, messages=openai_messages(CASES["chat"]), temperature=2.0, max_tokens=10, n=16, seed=7)
        free = [c.message.content for c in self.oai.chat.completions.create(**kw).choices]
        self.assertTrue(any(t != GREETING for t in free), "the precondition: unrestricted samples differ from greedy")
        for cut in ({"extra_body": {"top_k": 1}}, {"extra_body": {"min_p": 1.0}}, {"extra_body": {"min_p": 0.5}},
                    {"top_p": 0.5}, {"top_p": 0.5, "extra_body": {"top_k": 3, "min_p": 0.2}}):
            for seed in (7, 12345):
                r = self.oai.chat.completions.create(**{**kw, "seed": seed}, **cut)
                self.assertEqual([c.message.content for c in r.choices], [GREETING] * 16, cut)
                self.assertEqual({c.finish_reason for c in r.choices}, {"stop"}, cut)
        # top_k -1 (vLLM's "off") and 0, and top_p 1, cut nothing: the same seeded samples as without them.
        for off in ({"extra_body": {"top_k": -1}}, {"extra_body": {"top_k": 0}}, {"top_p": 1.0}, {"extra_body": {"min_p": 0.0}}):
            r = self.oai.chat.completions.create(**kw, **off)
            self.assertEqual([c.message.content for c in r.choices], free, off)
        # Anthropic's top_k and top_p (in the body) too.
        m = self.ant.messages.create(model=self.model, max_tokens=50, messages=[{"role": "user", "content": "Hi!"}],
                                     extra_body={"temperature": 1.0, "top_k": 1, "top_p": 0.5})
        self.assertEqual(m.content[0].text, GREETING)

    def test_logit_bias(self):
        # Through the client: +100 on a token makes it the greedy first token, -100 on the greedy
        # reply's first token moves the reply off it; a bad key is a 400.
        kw = dict(model=self.model, messages=openai_messages(CASES["chat"]), temperature=0, max_tokens=3,
                  extra_body={"return_token_ids": True})
        base = self.oai.chat.completions.create(**kw).choices[0].token_ids
        forced = self.oai.chat.completions.create(**kw, logit_bias={"50": 100}).choices[0].token_ids
        self.assertEqual(forced[0], 50)
        banned = self.oai.chat.completions.create(**kw, logit_bias={str(base[0]): -100}).choices[0].token_ids
        self.assertNotEqual(banned[0], base[0])
        with self.assertRaises(openai.BadRequestError):
            self.oai.chat.completions.create(**kw, logit_bias={"x": 1})

    def test_penalties(self):
        # "Once upon a time" with EOS ignored: the story, then <|im_end|> (258) again and again, each chosen
        # with logit 20 against exactly 0 for every other token (tests/reference/make_tool_model.py: the
        # hidden state is 8 on the current token's dimension, lm_head holds 10 / 4 for its successor and
        # zero in the rest of that column). The penalties as OpenAI and vLLM define them
        # (repetition first: positive logits of tokens in prompt or output divided by r; then
        # frequency * output count + presence when the count > 0 subtracted) end the repetition after
        # a number of 258s worked out from those logits; the tokens after it tie at 0, and the greedy
        # pick takes the lowest id among them (kernels/sampling.h), so 0, 1, 2, ...
        story = CASES["completion"]["completion_ids"][:-1]
        eos = GOLDEN["eos_token_id"]

        def ids(**kw):
            return self.oai.completions.create(model=self.model, prompt=CASES["completion"]["prompt"], temperature=0,
                                               max_tokens=24, extra_body={"ignore_eos": True, "return_token_ids": True,
                                                                          **kw.pop("extra", {})}, **kw).choices[0].token_ids

        self.assertEqual(ids(), story + [eos] * 18)
        # presence alone is at most 2: 20 - 2 > 0, no change.
        self.assertEqual(ids(presence_penalty=2.0), story + [eos] * 18)
        # 258 after k earlier 258s: 20 - 1.5 k, positive up to k = 13 (0.5), negative at k = 14 (-1).
        self.assertEqual(ids(frequency_penalty=1.5), story + [eos] * 14 + [0, 1, 2, 3])
        # 20 - 1.5 k - 1.25: positive up to k = 12 (0.75), negative at k = 13 (-0.75).
        self.assertEqual(ids(frequency_penalty=1.5, presence_penalty=1.25), story + [eos] * 13 + [0, 1, 2, 3, 4])
        # 20 / 10 - 1.5 k: positive at k = 1 (0.5), negative at k = 2 (-1). " a" of the story is also a
        # prompt token: 20 / 10 = 2 still beats 0. The ids then climb to "\n" (10), which owns a chain:
        # after it the greeting's "Hello" scores 20, and the greeting runs on.
        greeting = CASES["chat"]["completion_ids"]
        self.assertEqual(ids(frequency_penalty=1.5, extra={"repetition_penalty": 10.0}),
                         story + [eos] * 2 + list(range(11)) + greeting[:5])
        # A repetition penalty alone divides a positive logit and never takes it below 0: no change.
        self.assertEqual(ids(extra={"repetition_penalty": 100.0}), story + [eos] * 18)

    def test_sampling_parameter_errors(self):
        chat = {"model": self.model, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 2}
        auth = {"Authorization": "Bearer " + KEY}

        def refused(body, field, path="/v1/chat/completions"):
            status, err = self.server.post(path, body, auth)
            self.assertEqual(status, 400, (body, err))
            self.assertEqual(set(err), {"error"}, err)  # OpenAI's shape
            self.assertEqual(set(err["error"]), {"message", "type", "param", "code"}, err)
            self.assertEqual(err["error"]["type"], "invalid_request_error", err)
            self.assertIn(field, err["error"]["message"])

        for field, values in (("top_p", [0, -0.5, 1.01, 2]), ("top_k", [-2, -100, 1.5, "3", True]),
                              ("min_p", [-0.01, 1.01, "0.1"]), ("presence_penalty", [2.01, -2.01, 10]),
                              ("frequency_penalty", [2.5, -3]), ("repetition_penalty", [0, -1, 101]),
                              ("temperature", [-0.1, 2.01])):
            for v in values:
                refused({**chat, field: v}, field)
                refused({"model": self.model, "prompt": "Hi", field: v}, field, "/v1/completions")
        # JSON has no NaN or infinity: Python writes them as bare words, which are not JSON; nor is a number
        # too large for a double (nlohmann refuses 1e999).
        for field in ("top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature"):
            for raw in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
                body = json.dumps(chat)[:-1].encode() + b', "' + field.encode() + b'": ' + raw + b"}"
                status, err = self.server.post("/v1/chat/completions", body, auth)
                self.assertEqual((status, err["error"]["type"]), (400, "invalid_request_error"), (field, raw, err))
                self.assertIn("JSON", err["error"]["message"])
        # The SDK sees a BadRequestError.
        with self.assertRaises(openai.BadRequestError) as e:
            self.oai.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "x"}], top_p=0)
        self.assertIn("top_p", e.exception.body["message"])
        # Anthropic: top_p in (0, 1], top_k >= 0, in its own shape; OpenAI's other fields are unknown there.
        msg = {"model": self.model, "max_tokens": 5, "messages": [{"role": "user", "content": "Hi!"}]}
        for field, v in (("top_p", 0), ("top_p", 1.5), ("top_k", -1), ("top_k", 0.5), ("temperature", 1.5),
                         ("min_p", 0.5), ("frequency_penalty", 1)):
            status, err = self.server.post("/v1/messages", {**msg, field: v}, {"x-api-key": KEY})
            self.assertEqual(status, 400, (field, v, err))
            self.assertEqual((err["type"], err["error"]["type"]), ("error", "invalid_request_error"), err)
            self.assertIn(field, err["error"]["message"])

    # ---------------------------------------------------------------- completions
    def test_completions(self):
        c = CASES["completion"]
        r = self.oai.completions.create(model=self.model, prompt=c["prompt"], temperature=0, max_tokens=20)
        self.assertEqual(r.choices[0].text, c["completion_text"])
        self.assertEqual(r.usage.prompt_tokens, c["prompt_tokens"])
        r = self.oai.completions.create(model=self.model, prompt=c["prompt_ids"], temperature=0, max_tokens=20,
                                        echo=True, logprobs=2)
        self.assertEqual(r.choices[0].text, c["prompt"] + c["completion_text"])
        self.assertEqual(len(r.choices[0].logprobs.tokens), c["completion_tokens"])
        r = self.oai.completions.create(model=self.model, prompt=[c["prompt"], "Say: Hello!"], temperature=0, max_tokens=20, n=2)
        self.assertEqual([x.text for x in r.choices][:2], [c["completion_text"]] * 2)
        self.assertEqual(r.choices[2].text, " How can I help you today?")
        text = "".join(x.choices[0].text for x in self.oai.completions.create(
            model=self.model, prompt=c["prompt"], temperature=0, max_tokens=20, stream=True))
        self.assertEqual(text, c["completion_text"])

    # ---------------------------------------------------------------- tool calls
    def test_tool_call_openai(self):
        r = self.chat("tools", tools=[WEATHER_TOOL])
        msg = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(msg.content)
        self.assertEqual(len(msg.tool_calls), 1)
        self.assertEqual(msg.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(msg.tool_calls[0].function.arguments), {"city": "Paris"})
        self.assertTrue(msg.tool_calls[0].id.startswith("call_"))
        self.assertEqual(r.usage.prompt_tokens, CASES["tools"]["prompt_tokens"])  # tools rendered as transformers does
        # Streamed: the name first, then the arguments in pieces that add up.
        calls, finish = {}, None
        pieces = 0
        for chunk in self.chat("tools", tools=[WEATHER_TOOL], stream=True):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                self.assertFalse(c.delta.content)
                for tc in c.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                    if tc.id:
                        entry["id"] = tc.id
                    if tc.function.name:
                        entry["name"] += tc.function.name
                    entry["arguments"] += tc.function.arguments or ""
                    pieces += 1
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(list(calls), [0])
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertEqual(json.loads(calls[0]["arguments"]), {"city": "Paris"})
        self.assertGreater(pieces, 2)  # incremental
        # The result goes back; the template renders it as transformers does, and the model answers.
        r = self.chat("tool_result", tools=[WEATHER_TOOL])
        self.assertEqual(r.choices[0].message.content, WEATHER)
        self.assertEqual(r.usage.prompt_tokens, CASES["tool_result"]["prompt_tokens"])

    def test_tool_choice(self):
        r = self.chat("tools", tools=[WEATHER_TOOL], tool_choice="none")
        self.assertEqual(r.choices[0].message.content, GREETING)  # no tools in the prompt
        self.assertIsNone(r.choices[0].message.tool_calls)
        r = self.chat("chat", tools=[WEATHER_TOOL], tool_choice="required")
        self.assertEqual(r.choices[0].message.tool_calls[0].function.name, "get_weather")
        r = self.chat("tools", tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual(json.loads(r.choices[0].message.tool_calls[0].function.arguments), {"city": "Paris"})
        self.assertEqual(r.usage.prompt_tokens, CASES["forced_call_name"]["prompt_tokens"])
        with self.assertRaises(openai.BadRequestError):
            self.chat("tools", tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})

    def test_tool_use_anthropic(self):
        m = self.ant.messages.create(model=self.model, max_tokens=100, extra_body=T0, tools=[ANTHROPIC_TOOL],
                                     messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        self.assertEqual(m.stop_reason, "tool_use")
        self.assertEqual([b.type for b in m.content], ["tool_use"])
        self.assertEqual(m.content[0].name, "get_weather")
        self.assertEqual(m.content[0].input, {"city": "Paris"})
        self.assertEqual(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), CASES["tools"]["prompt_tokens"])
        with self.ant.messages.stream(model=self.model, max_tokens=100, extra_body=T0, tools=[ANTHROPIC_TOOL],
                                      messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as s:
            final = s.get_final_message()
        self.assertEqual(final.content[0].input, {"city": "Paris"})
        result = self.ant.messages.create(
            model=self.model, max_tokens=100, extra_body=T0, tools=[ANTHROPIC_TOOL],
            messages=[{"role": "user", "content": "What is the weather in Paris?"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                                          "input": {"city": "Paris"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                     "content": CASES["tool_result"]["messages"][2]["content"]}]}])
        self.assertEqual(result.content[0].text, WEATHER)
        self.assertEqual(result.usage.input_tokens + (result.usage.cache_read_input_tokens or 0),
                         CASES["tool_result"]["prompt_tokens"])

    def test_tool_choice_anthropic(self):
        # tool_choice end to end, beside the OpenAI route's none / required / named on the same tools.
        # tiny-tools calls the tool whenever tools are in the prompt, unless a tool result is in the
        # context (then it reports the weather): forcing is seen on the tool-result conversation.
        question = [{"role": "user", "content": "What is the weather in Paris?"}]
        result = question + [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                          "content": CASES["tool_result"]["messages"][2]["content"]}]}]
        oai_result = openai_messages(CASES["tool_result"])

        def ant(messages, choice=None, tools=(ANTHROPIC_TOOL,)):
            kw = {"tool_choice": choice} if choice else {}
            return self.ant.messages.create(model=self.model, max_tokens=100, extra_body=T0, tools=list(tools),
                                            messages=messages, **kw)

        def oai(messages, choice):
            return self.oai.chat.completions.create(model=self.model, messages=messages, temperature=0,
                                                    tools=[WEATHER_TOOL], tool_choice=choice)

        def prompt_tokens(m):
            return m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)

        def called(m):
            self.assertEqual(m.stop_reason, "tool_use")
            self.assertEqual([(b.type, b.name, b.input) for b in m.content], [("tool_use", "get_weather", {"city": "Paris"})])
            self.assertTrue(m.content[0].id.startswith("toolu_"))

        def called_oai(r):
            self.assertEqual(r.choices[0].finish_reason, "tool_calls")
            c = r.choices[0].message.tool_calls
            self.assertEqual([(x.function.name, json.loads(x.function.arguments)) for x in c], [("get_weather", {"city": "Paris"})])

        # auto: as without tool_choice.
        for choice in (None, {"type": "auto"}):
            m = ant(question, choice)
            called(m)
            self.assertEqual(prompt_tokens(m), CASES["tools"]["prompt_tokens"])
            m = ant(result, choice)
            self.assertEqual(([b.type for b in m.content], m.content[0].text, m.stop_reason), (["text"], WEATHER, "end_turn"))
            self.assertEqual(prompt_tokens(m), CASES["tool_result"]["prompt_tokens"])
        # any (OpenAI "required"): the reply opens with <tool_call> (one token of tiny-tools), so a call
        # comes even after a tool result.
        m = ant(result, {"type": "any"})
        called(m)
        self.assertEqual(prompt_tokens(m), CASES["tool_result"]["prompt_tokens"] + 1)
        r = oai(oai_result, "required")
        called_oai(r)
        self.assertEqual(r.usage.prompt_tokens, CASES["tool_result"]["prompt_tokens"] + 1)
        called(ant(result, {"type": "any", "disable_parallel_tool_use": True}))
        # tool (OpenAI named): the call's opening up to "arguments": is the prompt's (transformers' count
        # of that prompt is golden's forced_call_name).
        m = ant(question, {"type": "tool", "name": "get_weather"})
        called(m)
        self.assertEqual(prompt_tokens(m), CASES["forced_call_name"]["prompt_tokens"])
        named = {"type": "function", "function": {"name": "get_weather"}}
        forced_extra = CASES["forced_call_name"]["prompt_tokens"] - CASES["tools"]["prompt_tokens"]
        m = ant(result, {"type": "tool", "name": "get_weather"})
        called(m)
        self.assertEqual(prompt_tokens(m), CASES["tool_result"]["prompt_tokens"] + forced_extra)
        r = oai(oai_result, named)
        called_oai(r)
        self.assertEqual(r.usage.prompt_tokens, CASES["tool_result"]["prompt_tokens"] + forced_extra)
        # none: the tools stay out of the prompt, as on the OpenAI route.
        m = ant(question, {"type": "none"})
        self.assertEqual((m.content[0].text, m.stop_reason), (GREETING, "end_turn"))
        self.assertEqual(prompt_tokens(m), oai(openai_messages(CASES["tools"]), "none").usage.prompt_tokens)
        self.assertEqual(prompt_tokens(m), prompt_tokens(ant(question, tools=())))
        m = ant(result, {"type": "none"})
        self.assertEqual((m.content[0].text, m.stop_reason), (WEATHER, "end_turn"))
        self.assertEqual(prompt_tokens(m), CASES["tool_result_no_tools"]["prompt_tokens"])
        self.assertEqual(oai(oai_result, "none").usage.prompt_tokens, CASES["tool_result_no_tools"]["prompt_tokens"])
        # Refused, in Anthropic's error shape.
        for choice, tools in (({"type": "tool", "name": "nope"}, [ANTHROPIC_TOOL]), ({"type": "any"}, []),
                              ({"type": "tool", "name": "get_weather"}, []), ({"type": "sometimes"}, [ANTHROPIC_TOOL]),
                              ({"type": "tool"}, [ANTHROPIC_TOOL]), ("auto", [ANTHROPIC_TOOL])):
            status, err = self.server.post("/v1/messages", {"model": self.model, "max_tokens": 5, "messages": question,
                                                            "tools": tools, "tool_choice": choice}, {"x-api-key": KEY})
            self.assertEqual((status, err["type"], err["error"]["type"]), (400, "error", "invalid_request_error"), (choice, err))
            self.assertIn("tool_choice", err["error"]["message"])

    def test_tool_use_anthropic_stream(self):
        # The input_json_delta pieces of a streamed tool_use block add up to the JSON of its input.
        question = [{"role": "user", "content": "What is the weather in Paris?"}]
        for choice in (None, {"type": "tool", "name": "get_weather"}, {"type": "any"}):
            kw = {"tool_choice": choice} if choice else {}
            events = list(self.ant.messages.create(model=self.model, max_tokens=100, extra_body=T0, tools=[ANTHROPIC_TOOL],
                                                   messages=question, stream=True, **kw))
            types = [e.type for e in events]
            self.assertEqual(types[0], "message_start")
            self.assertEqual(types[-2:], ["message_delta", "message_stop"])
            starts = [e for e in events if e.type == "content_block_start"]
            self.assertEqual(len(starts), 1, choice)
            block = starts[0].content_block
            self.assertEqual((block.type, block.name, block.input), ("tool_use", "get_weather", {}))
            self.assertTrue(block.id.startswith("toolu_"))
            deltas = [e.delta for e in events if e.type == "content_block_delta"]
            self.assertEqual({d.type for d in deltas}, {"input_json_delta"}, choice)
            self.assertGreater(len(deltas), 1)  # incremental
            self.assertEqual(json.loads("".join(d.partial_json for d in deltas)), {"city": "Paris"})
            self.assertEqual({e.index for e in events if e.type.startswith("content_block")}, {0})
            self.assertEqual([e.delta.stop_reason for e in events if e.type == "message_delta"], ["tool_use"])
            # The same input as the response without streaming.
            m = self.ant.messages.create(model=self.model, max_tokens=100, extra_body=T0, tools=[ANTHROPIC_TOOL],
                                         messages=question, **kw)
            self.assertEqual(m.content[0].input, json.loads("".join(d.partial_json for d in deltas)))

    # ---------------------------------------------------------------- Anthropic messages
    def test_messages(self):
        c = CASES["chat_system"]
        m = self.ant.messages.create(model=self.model, max_tokens=50, extra_body=T0, system=c["messages"][0]["content"],
                                     messages=c["messages"][1:])
        self.assertEqual(m.content[0].text, c["completion_text"])
        self.assertEqual(m.stop_reason, "end_turn")
        self.assertEqual(m.usage.output_tokens, c["completion_tokens"])
        self.assertEqual(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), c["prompt_tokens"])
        m = self.ant.messages.create(model=self.model, max_tokens=2, extra_body=T0, messages=[{"role": "user", "content": "Hi!"}])
        self.assertEqual((m.content[0].text, m.stop_reason), ("Hello!", "max_tokens"))
        # A final assistant message is a prefill the reply continues.
        m = self.ant.messages.create(model=self.model, max_tokens=50, extra_body=T0,
                                     messages=[{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello!"}])
        self.assertEqual(m.content[0].text, CASES["forced_greeting"]["completion_text"])
        count = self.ant.messages.count_tokens(model=self.model, messages=[{"role": "user", "content": "Hi!"}])
        self.assertEqual(count.input_tokens, CASES["chat"]["prompt_tokens"])

    def test_messages_stream_event_order(self):
        with self.ant.messages.stream(model=self.model, max_tokens=50, extra_body=T0,
                                      messages=[{"role": "user", "content": [{"type": "text", "text": "Hi!"}]}]) as s:
            events = [e.type for e in s if e.type != "text"]  # the SDK adds "text" helper events
            final = s.get_final_message()
        raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                          "content_block_stop", "message_delta", "message_stop")]
        n_deltas = raw.count("content_block_delta")
        self.assertEqual(raw, ["message_start", "content_block_start"] + ["content_block_delta"] * n_deltas +
                         ["content_block_stop", "message_delta", "message_stop"])
        self.assertGreater(n_deltas, 3)
        self.assertEqual(final.content[0].text, GREETING)
        self.assertEqual(final.usage.output_tokens, CASES["chat"]["completion_tokens"])

    # ---------------------------------------------------------------- errors
    def test_openai_errors(self):
        with self.assertRaises(openai.NotFoundError) as e:
            self.oai.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError) as e:
            self.oai.chat.completions.create(model=self.model, messages=[])
        self.assertIn("messages", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError) as e:
            self.oai.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "x" * 5000}])
        self.assertEqual(e.exception.body["code"], "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as e:
            self.oai.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "x"}],
                                             response_format={"type": "json_schema", "json_schema": {
                                                 "name": "a", "schema": {"type": "string", "pattern": "^a"}}})
        self.assertIn("response_format", e.exception.body["message"])
        self.assertIn("'pattern'", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError) as e:
            self.oai.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "x"}],
                                             extra_body={"bogus_field": 1})
        self.assertIn("bogus_field", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError):
            self.oai.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "x"}], temperature=7)
        bad = openai.OpenAI(base_url=self.server.url + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError) as e:
            bad.models.list()
        self.assertEqual(e.exception.body["type"], "authentication_error")
        status, body = self.server.post("/v1/chat/completions", b'{"model": "tiny-tools", "messages": [',
                                        {"Authorization": "Bearer " + KEY})
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertIn("JSON", body["error"]["message"])

    def test_anthropic_errors(self):
        with self.assertRaises(anthropic.NotFoundError) as e:
            self.ant.messages.create(model="claude-9", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.body["type"], "error")
        self.assertEqual(e.exception.body["error"]["type"], "not_found_error")
        status, body = self.server.post("/v1/messages", {"model": self.model, "messages": [{"role": "user", "content": "x"}]},
                                        {"x-api-key": KEY})
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertIn("max_tokens", body["error"]["message"])
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.ant.messages.create(model=self.model, max_tokens=100, messages=[{"role": "user", "content": "x" * 5000}])
        self.assertIn("too long", e.exception.body["error"]["message"])
        status, body = self.server.post("/v1/messages", b"{nope", {"x-api-key": KEY})
        self.assertEqual((status, body["type"], body["error"]["type"]), (400, "error", "invalid_request_error"))
        bad = anthropic.Anthropic(base_url=self.server.url, api_key="wrong", max_retries=0)
        with self.assertRaises(anthropic.AuthenticationError) as e:
            bad.messages.create(model=self.model, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.body["error"]["type"], "authentication_error")

    # ---------------------------------------------------------------- operations
    def test_health_metrics_page(self):
        self.assertEqual(json.loads(self.server.get("/health"))["status"], "ok")
        self.chat("chat")
        m = self.server.metrics({"Authorization": "Bearer " + KEY})
        for name in ("kiln_requests_running", "kiln_requests_waiting", "kiln_kv_usage_ratio", "kiln_prefix_cache_hit_rate",
                     "kiln_policy_version", "kiln_generation_tokens_total", "kiln_time_to_first_token_seconds_count",
                     "kiln_time_per_output_token_seconds_count", "kiln_e2e_request_latency_seconds_count"):
            self.assertIn(name, m)
        self.assertGreater(m['kiln_requests_total{route="/v1/chat/completions",status="200"}'], 0)
        page = self.server.get("/")
        self.assertIn("<html", page.lower())
        self.assertNotIn("http://", page.replace(self.server.url, ""))  # nothing from the network
        self.assertIn('"path":"/v1/chat/completions"', self.server.read_log())  # the access log

    def test_run_batch(self):
        lines = [
            {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": self.model, "messages": openai_messages(CASES["chat"]), "temperature": 0}},
            {"custom_id": "b", "method": "POST", "url": "/v1/completions",
             "body": {"model": self.model, "prompt": CASES["completion"]["prompt"], "temperature": 0, "max_tokens": 20}},
            {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": self.model, "messages": openai_messages(CASES["tools"]), "tools": [WEATHER_TOOL], "temperature": 0}},
            {"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "nope", "messages": []}},
            {"custom_id": "b", "method": "POST", "url": "/v1/completions",
             "body": {"model": self.model, "prompt": "again", "max_tokens": 2}},
        ]
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
            with open(src, "w") as f:
                f.write("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
            p = subprocess.run([KILN, "run-batch", "--model", MODEL, "-i", src, "-o", dst], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1, p.stderr)  # three lines failed
            out = [json.loads(x) for x in open(dst)]
        self.assertEqual([o["custom_id"] for o in out], ["a", "b", "c", "d", "b", None])
        self.assertEqual(out[0]["response"]["status_code"], 200)
        self.assertEqual(out[0]["response"]["body"]["choices"][0]["message"]["content"], GREETING)
        self.assertEqual(out[1]["response"]["body"]["choices"][0]["text"], CASES["completion"]["completion_text"])
        call = out[2]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]
        self.assertEqual((call["function"]["name"], json.loads(call["function"]["arguments"])), ("get_weather", {"city": "Paris"}))
        self.assertEqual(out[3]["response"]["status_code"], 404)
        self.assertIsNone(out[4]["response"])  # a repeated custom_id: its line fails, the first ran
        self.assertIn("repeats line 2", out[4]["error"]["message"])
        self.assertIsNone(out[5]["response"])
        self.assertIn("line 6", out[5]["error"]["message"])


if __name__ == "__main__":
    unittest.main()
