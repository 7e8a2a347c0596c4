// openai_tools.mjs — tool use through the official OpenAI Node client (npm
// `openai`) against the tangram daemon, for
// tests/integration/test_daemon_tools.py.
//
// usage: node openai_tools.mjs BASE_URL MODEL
//   env OPENAI_API_KEY: the daemon's key
//
// Sends chat requests with tools (non-streaming and streaming, greedy so
// the two must agree), a conversation with an assistant tool call (content
// null, arguments as a JSON string, as the client types them) and its tool
// result (tool_choice "required": openai_structured.mjs).
// Prints one JSON object with what the client saw; the Python test judges
// it. Exits 0 when every call returned as expected by type, 1 when the
// client threw unexpectedly.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node openai_tools.mjs BASE_URL MODEL");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 60000 });

const TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string", description: "City name" } },
      required: ["city"],
    },
  },
}];
const MESSAGES = [
  { role: "system", content: "You can call tools." },
  { role: "user", content: "What is the weather in Paris?" },
];
const HISTORY = MESSAGES.concat([
  { role: "assistant", content: null, tool_calls: [{
      id: "call_abc123", type: "function",
      function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } }] },
  { role: "tool", tool_call_id: "call_abc123", content: "21 C, sunny" },
]);
const out = {};

function message(m) {
  return { role: m.role, content: m.content ?? null,
           tool_calls: m.tool_calls ?? null };
}

async function collect(stream) {
  const r = { chunks: 0, content: "", tool_calls: [], finish_reason: null,
              first_role: null, usage: null };
  for await (const chunk of stream) {
    r.chunks++;
    if (chunk.usage) r.usage = chunk.usage;
    for (const c of chunk.choices || []) {
      if (r.chunks === 1) r.first_role = c.delta?.role ?? null;
      r.content += c.delta?.content ?? "";
      for (const t of c.delta?.tool_calls ?? []) r.tool_calls.push(t);
      if (c.finish_reason) r.finish_reason = c.finish_reason;
    }
  }
  return r;
}

async function main() {
  const chat = await client.chat.completions.create({
    model, messages: MESSAGES, tools: TOOLS, tool_choice: "auto",
    max_tokens: 12, temperature: 0 });
  out.chat = { object: chat.object, message: message(chat.choices[0].message),
               finish_reason: chat.choices[0].finish_reason, usage: chat.usage };

  out.stream = await collect(await client.chat.completions.create({
    model, messages: MESSAGES, tools: TOOLS, max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true } }));

  const hist = await client.chat.completions.create({
    model, messages: HISTORY, tools: TOOLS, max_tokens: 6, temperature: 0 });
  out.history = { message: message(hist.choices[0].message),
                  finish_reason: hist.choices[0].finish_reason,
                  usage: hist.usage };

  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error("client error:", e?.status ?? "", e?.message ?? e);
  console.log(JSON.stringify(out));
  process.exit(1);
});
