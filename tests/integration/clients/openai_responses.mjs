// openai_responses.mjs — the Responses API through the official OpenAI Node
// client (npm `openai`) against the tangram daemon, for
// tests/integration/test_daemon_responses.py.
//
// usage: node openai_responses.mjs BASE_URL MODEL
//   env OPENAI_API_KEY: the daemon's key
//
// responses.create (and a second turn with previous_response_id),
// responses.stream (the client's stream helper, which rebuilds the response
// from the events and throws on an event out of place) and its
// finalResponse, responses.retrieve, responses.inputItems.list (iterated
// through the client's cursor pages), responses.delete and a retrieve
// that must then fail with 404, a function-tool round trip (a forced call,
// then its function_call_output with previous_response_id), and
// responses.parse with zodTextFormat. Prints one JSON object with what the
// client saw; the Python test judges it. Exits 1 when the client threw
// where it should not have.
import OpenAI from "openai";
import { zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node openai_responses.mjs BASE_URL MODEL");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 120000 });
const out = {};

// output_text is the client's convenience (the stream helper's final
// response lacks it): the text parts of the output, as the client joins them.
function text(r) {
  return r.output.filter((o) => o.type === "message")
    .flatMap((o) => o.content).filter((c) => c.type === "output_text")
    .map((c) => c.text).join("");
}

function brief(r) {
  return { id: r.id, status: r.status, output_text: text(r),
           client_output_text: r.output_text ?? null,
           output: r.output, usage: r.usage,
           previous_response_id: r.previous_response_id ?? null };
}

try {
  const r1 = await client.responses.create({
    model, input: "Tell me a story.", max_output_tokens: 6, temperature: 0 });
  out.create = brief(r1);
  const r2 = await client.responses.create({
    model, input: "Go on.", previous_response_id: r1.id,
    max_output_tokens: 6, temperature: 0 });
  out.turn2 = brief(r2);

  const stream = client.responses.stream({
    model, input: "Stream a line.", max_output_tokens: 8, temperature: 0 });
  const types = [];
  let deltas = "";
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") deltas += ev.delta;
  }
  const fin = await stream.finalResponse();
  out.stream = { types, deltas, final: brief(fin) };

  out.retrieve = brief(await client.responses.retrieve(r2.id));
  const items = [];
  for await (const it of client.responses.inputItems.list(r2.id, { limit: 1 }))
    items.push({ id: it.id, type: it.type, role: it.role ?? null });
  out.input_items = items;

  await client.responses.delete(r1.id);
  try {
    await client.responses.retrieve(r1.id);
    out.after_delete = { status: 200 };
  } catch (e) {
    out.after_delete = { status: e.status ?? null, code: e.code ?? null };
  }

  const tools = [{ type: "function", name: "get_weather",
                   description: "Get the weather in a city.",
                   parameters: { type: "object",
                                 properties: { city: { type: "string" } },
                                 required: ["city"], additionalProperties: false },
                   strict: true }];
  const t1 = await client.responses.create({
    model, input: "Weather in Paris?", tools,
    tool_choice: { type: "function", name: "get_weather" },
    max_output_tokens: 60, temperature: 0 });
  const call = t1.output.find((o) => o.type === "function_call");
  out.tool_call = call ?? null;
  if (call) {
    const t2 = await client.responses.create({
      model, previous_response_id: t1.id, tools,
      input: [{ type: "function_call_output", call_id: call.call_id,
                output: JSON.stringify({ temperature: 21 }) }],
      max_output_tokens: 6, temperature: 0 });
    out.tool_result = brief(t2);
  }

  const Answer = z.object({ answer: z.enum(["yes", "no"]) });
  const p = await client.responses.parse({
    model, input: "Answer yes or no.", max_output_tokens: 40, temperature: 0,
    text: { format: zodTextFormat(Answer, "answer") } });
  out.parse = { status: p.status, output_parsed: p.output_parsed ?? null,
                output_text: p.output_text };
} catch (e) {
  out.error = String(e && e.stack || e);
  console.log(JSON.stringify(out));
  process.exit(1);
}
console.log(JSON.stringify(out));
