// openai_client.mjs — drives the tangram daemon with the official OpenAI Node
// client (npm `openai`), for tests/integration/test_daemon_http.py.
//
// usage: node openai_client.mjs BASE_URL MODEL
//   BASE_URL  the daemon's OpenAI root, e.g. http://127.0.0.1:8000/v1
//   MODEL     the served model name
//   env OPENAI_API_KEY: the daemon's key (any string when it has none)
//
// Runs completions and chat completions, non-streaming and streaming (with
// stream_options.include_usage), greedy (temperature 0) so the two forms of
// each endpoint must agree, models.list and models.retrieve (the served
// model, and an unknown one that must fail with NotFoundError), plus one
// call with a wrong key that must fail with the client's
// AuthenticationError. Prints one JSON object on stdout
// with what the client saw; the Python test judges it. Exits 0 when every
// call returned (right or wrong answers are the test's business), 1 when the
// client threw unexpectedly.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node openai_client.mjs BASE_URL MODEL");
  process.exit(2);
}
const apiKey = process.env.OPENAI_API_KEY || "none";
// No retries: a retried request would hide a server error.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const PROMPT = "The quick brown fox";
const MESSAGES = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Name three colors." },
];
const out = {};

// Collects a stream: every chunk's object type, the text, the finish
// reason, the usage chunk and the role of the first chat delta.
async function collect(stream, chat) {
  const r = { chunks: 0, objects: [], text: "", finish_reason: null,
              usage: null, first_role: null, usage_chunks: 0 };
  for await (const chunk of stream) {
    r.chunks++;
    if (!r.objects.includes(chunk.object)) r.objects.push(chunk.object);
    if (chunk.usage) {
      r.usage = chunk.usage;
      if (!chunk.choices || chunk.choices.length === 0) r.usage_chunks++;
    }
    for (const c of chunk.choices || []) {
      if (chat) {
        if (r.chunks === 1) r.first_role = c.delta?.role ?? null;
        r.text += c.delta?.content ?? "";
      } else {
        r.text += c.text ?? "";
      }
      if (c.finish_reason) r.finish_reason = c.finish_reason;
    }
  }
  return r;
}

async function main() {
  const comp = await client.completions.create({
    model, prompt: PROMPT, max_tokens: 8, temperature: 0 });
  out.completion = { object: comp.object, text: comp.choices[0].text,
                     finish_reason: comp.choices[0].finish_reason,
                     usage: comp.usage };

  out.completion_stream = await collect(await client.completions.create({
    model, prompt: PROMPT, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true } }), false);

  const chat = await client.chat.completions.create({
    model, messages: MESSAGES, max_tokens: 8, temperature: 0 });
  out.chat = { object: chat.object, role: chat.choices[0].message.role,
               text: chat.choices[0].message.content,
               finish_reason: chat.choices[0].finish_reason,
               usage: chat.usage };

  out.chat_stream = await collect(await client.chat.completions.create({
    model, messages: MESSAGES, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true } }), true);

  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  const one = await client.models.retrieve(model);
  out.model = { id: one.id, object: one.object, owned_by: one.owned_by };
  try {
    await client.models.retrieve(model + "-nope");
    out.model_missing = { threw: false };
  } catch (e) {
    out.model_missing = { threw: true, status: e.status ?? null,
                          not_found: e instanceof OpenAI.NotFoundError,
                          code: e.code ?? null };
  }

  const bad = new OpenAI({ baseURL, apiKey: apiKey + "-wrong", maxRetries: 0,
                           timeout: 30000 });
  try {
    await bad.completions.create({ model, prompt: PROMPT, max_tokens: 2 });
    out.bad_key = { threw: false };
  } catch (e) {
    out.bad_key = { threw: true, status: e.status ?? null,
                    auth_error: e instanceof OpenAI.AuthenticationError,
                    message: String(e.message || "") };
  }
}

try {
  await main();
  process.stdout.write(JSON.stringify(out) + "\n");
} catch (e) {
  out.exception = { name: e?.constructor?.name ?? "Error",
                    status: e?.status ?? null, message: String(e?.message) };
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(1);
}
