// openai_params.mjs — OpenAI request parameters through the official OpenAI
// Node client (npm `openai`) against the tangram daemon, for
// tests/integration/test_daemon_params.py.
//
// usage: node openai_params.mjs BASE_URL MODEL IDS_JSON
//   IDS_JSON: {"force": id, "ban": [ids]} — a token to force with
//   logit_bias +100, and the ids of PROMPT's greedy first token's text, to
//   ban with -100
//   env OPENAI_API_KEY: the daemon's key
//
// Sends completions and chats with logit_bias (non-streaming and
// streaming), completions with echo (both forms), and the requests the
// server refuses with 400 (echo with logprobs, a response_format schema
// with an unsupported keyword, logit_bias outside the vocabulary, n = 17).
// Prints one JSON
// object with what the client saw; the Python test judges it. Exits 1 only
// when the client threw where it should not have.
import OpenAI from "openai";

const [baseURL, model, idsJson] = process.argv.slice(2);
if (!baseURL || !model || !idsJson) {
  console.error("usage: node openai_params.mjs BASE_URL MODEL IDS_JSON");
  process.exit(2);
}
const ids = JSON.parse(idsJson);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 60000 });
const PROMPT = "The quick brown fox";
const out = {};

async function streamText(params) {
  const stream = await client.completions.create({ ...params, stream: true,
    stream_options: { include_usage: true } });
  const r = { text: "", chunks: 0, usage: null, finish_reason: null };
  for await (const chunk of stream) {
    r.chunks++;
    if (chunk.usage) r.usage = chunk.usage;
    for (const c of chunk.choices || []) {
      r.text += c.text ?? "";
      if (c.finish_reason) r.finish_reason = c.finish_reason;
    }
  }
  return r;
}

// A request the server must refuse: what the client threw.
async function refused(fn) {
  try {
    await fn();
    return { threw: false };
  } catch (e) {
    return { threw: true, status: e.status ?? null,
             bad_request: e instanceof OpenAI.BadRequestError,
             param: e.param ?? e.error?.param ?? null,
             message: String(e.message ?? "") };
  }
}

async function main() {
  const base = { model, prompt: PROMPT, max_tokens: 4, temperature: 0,
                 ignore_eos: true };
  const force = { [String(ids.force)]: 100 };
  const ban = Object.fromEntries(ids.ban.map((i) => [String(i), -100]));

  const plain = await client.completions.create(base);
  out.plain = { text: plain.choices[0].text, usage: plain.usage };
  const forced = await client.completions.create({ ...base, logit_bias: force });
  out.forced = { text: forced.choices[0].text, usage: forced.usage };
  out.forced_stream = await streamText({ ...base, logit_bias: force });
  // Sampling (temperature 1) cannot escape a +100 bias either.
  const hot = await client.completions.create({ ...base, temperature: 1,
                                                seed: 5, logit_bias: force });
  out.forced_hot = { text: hot.choices[0].text };
  const banned = await client.completions.create({ ...base, max_tokens: 1,
                                                   logit_bias: ban });
  out.banned = { text: banned.choices[0].text };
  const chat = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Say something." }],
    max_tokens: 3, temperature: 0, logit_bias: force, ignore_eos: true });
  out.chat_forced = { content: chat.choices[0].message.content,
                      usage: chat.usage };

  const echoed = await client.completions.create({ ...base, echo: true });
  out.echo = { text: echoed.choices[0].text, usage: echoed.usage,
               finish_reason: echoed.choices[0].finish_reason };
  out.echo_stream = await streamText({ ...base, echo: true });

  out.echo_logprobs = await refused(() => client.completions.create({
    ...base, echo: true, logprobs: 1 }));
  out.json_schema = await refused(() => client.chat.completions.create({
    model, messages: [{ role: "user", content: "JSON please" }],
    max_tokens: 3, response_format: { type: "json_schema", json_schema: {
      name: "ids", schema: { type: "array", uniqueItems: true } } } }));
  out.bias_range = await refused(() => client.completions.create({
    ...base, logit_bias: { "99999999": 5 } }));
  out.bias_value = await refused(() => client.completions.create({
    ...base, logit_bias: { [String(ids.force)]: 150 } }));
  out.n17 = await refused(() => client.completions.create({ ...base, n: 17 }));
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.log(JSON.stringify({ error: String(e && e.stack || e) }));
  process.exit(1);
});
