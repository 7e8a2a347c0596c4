// openai_n.mjs — several choices per request (OpenAI `n`) through the
// official OpenAI Node client (npm `openai`) against the tangram daemon,
// for tests/integration/test_daemon_n.py.
//
// usage: node openai_n.mjs BASE_URL MODEL
//   env OPENAI_API_KEY: the daemon's key
//
// Sends a greedy chat with n = 2 (non-streaming and streaming, the stream
// reassembled per choice index) and a greedy completion with n = 1 to
// compare with. Prints one JSON object with what the client saw; the
// Python test judges it. Exits 1 only when the client threw.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node openai_n.mjs BASE_URL MODEL");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 60000 });
const out = {};

async function main() {
  const chat = { model, messages: [{ role: "user", content: "Say something." }],
                 max_tokens: 5, temperature: 0, ignore_eos: true };
  const one = await client.chat.completions.create(chat);
  out.one = { content: one.choices[0].message.content, usage: one.usage };
  const two = await client.chat.completions.create({ ...chat, n: 2 });
  out.two = { choices: two.choices.map((c) => ({
                index: c.index, content: c.message.content,
                finish_reason: c.finish_reason })),
              usage: two.usage, id: two.id };
  const stream = await client.chat.completions.create({
    ...chat, n: 2, stream: true, stream_options: { include_usage: true } });
  const s = { choices: {}, usage: null, ids: new Set(), roles: {} };
  for await (const chunk of stream) {
    s.ids.add(chunk.id);
    if (chunk.usage) s.usage = chunk.usage;
    for (const c of chunk.choices || []) {
      const x = (s.choices[c.index] ??= { content: "", finish_reason: null });
      if (c.delta?.role) s.roles[c.index] = c.delta.role;
      x.content += c.delta?.content ?? "";
      if (c.finish_reason) x.finish_reason = c.finish_reason;
    }
  }
  out.stream = { choices: s.choices, usage: s.usage, ids: [...s.ids],
                 roles: s.roles };
  out.n17 = null;
  try {
    await client.chat.completions.create({ ...chat, n: 17 });
  } catch (e) {
    out.n17 = { status: e.status ?? null,
                bad_request: e instanceof OpenAI.BadRequestError,
                param: e.param ?? e.error?.param ?? null };
  }
}

main().then(() => console.log(JSON.stringify(out)), (e) => {
  console.log(JSON.stringify({ error: String(e && e.stack || e) }));
  process.exit(1);
});
