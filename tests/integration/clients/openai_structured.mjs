// openai_structured.mjs — structured outputs through the official OpenAI
// Node client (npm `openai`) against the tangram daemon, for
// tests/integration/test_daemon_structured.py.
//
// usage: node openai_structured.mjs BASE_URL MODEL BIAS_JSON
//   BIAS_JSON: a logit_bias object ({"id": bias}) that keeps the random
//   model's documents short (the mask still decides what is allowed)
//
// client.chat.completions.parse with a json_schema response_format (the
// client parses the content into message.parsed), and with strict tools
// under tool_choice "required" (the client parses every call's arguments
// into parsed_arguments); chat.completions.create with a named function.
// Prints one JSON object with what the client saw; the Python test judges
// it (and validates against the schemas). Exits 1 when the client threw.
import OpenAI from "openai";

const [baseURL, model, biasJson] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node openai_structured.mjs BASE_URL MODEL BIAS_JSON");
  process.exit(2);
}
const logit_bias = JSON.parse(biasJson || "{}");
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 120000 });

const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer" },
    tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 3 },
  },
  required: ["name", "age", "tags"],
  additionalProperties: false,
};
const TOOLS = [
  { type: "function", function: { name: "get_weather", strict: true,
    parameters: { type: "object",
                  properties: { city: { type: "string", maxLength: 10 },
                                unit: { enum: ["celsius", "fahrenheit"] } },
                  required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "search", strict: true,
    parameters: { type: "object", properties: { q: { type: "string", maxLength: 8 } },
                  required: ["q"], additionalProperties: false } } },
];
const MESSAGES = [{ role: "user", content: "Describe a person, or call a tool." }];
const out = {};

async function main() {
  const p = await client.chat.completions.parse({
    model, messages: MESSAGES, temperature: 0, max_tokens: 300, logit_bias,
    response_format: { type: "json_schema",
                       json_schema: { name: "person", schema: PERSON, strict: true } },
  });
  const pm = p.choices[0].message;
  out.parse = { parsed: pm.parsed ?? null, content: pm.content,
                finish_reason: p.choices[0].finish_reason };

  const r = await client.chat.completions.parse({
    model, messages: MESSAGES, temperature: 0, max_tokens: 300, logit_bias,
    tools: TOOLS, tool_choice: "required",
  });
  const rm = r.choices[0].message;
  out.required = { finish_reason: r.choices[0].finish_reason,
                   calls: (rm.tool_calls ?? []).map((c) => ({
                     name: c.function.name, arguments: c.function.arguments,
                     parsed: c.function.parsed_arguments ?? null })) };

  const n = await client.chat.completions.create({
    model, messages: MESSAGES, temperature: 0, max_tokens: 300, logit_bias,
    tools: TOOLS, tool_choice: { type: "function", function: { name: "search" } },
  });
  const nm = n.choices[0].message;
  out.named = { finish_reason: n.choices[0].finish_reason,
                calls: (nm.tool_calls ?? []).map((c) => ({
                  name: c.function.name, arguments: c.function.arguments })) };
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error("client error:", e?.status ?? "", e?.message ?? e);
  console.log(JSON.stringify(out));
  process.exit(1);
});
