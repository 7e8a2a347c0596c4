// zod_structured.mjs — the schemas zod writes, served through the
// official OpenAI Node client (npm `openai`) against the tangram daemon,
// for tests/integration/test_daemon_zod.py.
//
// usage: node zod_structured.mjs BASE_URL MODEL BIAS_JSON
//   BIAS_JSON: a logit_bias object ({"id": bias}) toward closing tokens,
//   so the random model's documents end (the mask still decides what is
//   allowed)
//
// For each case, zod (npm `zod`, its v4 API) writes the JSON Schema
// (z.toJSONSchema, draft 2020-12) that the AI SDK, the OpenAI helpers and
// LangChain send; the client asks for two answers under it; every answer
// that finished ("stop") is parsed as JSON and checked by zod itself
// (safeParse of the same schema). Also client.chat.completions.parse with
// zodResponseFormat (the helper's own conversion, zod v3 API). Prints one
// JSON object; the Python test judges it. Exits 1 when the client threw
// on something other than a refusal.
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod/v4";
import { CASES } from "./zod_cases.mjs";
import { z as z3 } from "zod";

const [baseURL, model, biasJson] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node zod_structured.mjs BASE_URL MODEL BIAS_JSON");
  process.exit(2);
}
const logit_bias = JSON.parse(biasJson || "{}");
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 300000 });


const MESSAGES = [{ role: "user", content: "Answer in JSON." }];
const out = { cases: {} };

async function one(name, schema) {
  const json = z.toJSONSchema(schema);
  const r = { schema: json, answers: [] };
  try {
    const c = await client.chat.completions.create({
      model, messages: MESSAGES, temperature: 1.0, seed: 7, n: 2,
      max_tokens: 300, logit_bias,
      response_format: { type: "json_schema",
                         json_schema: { name: name, schema: json } } });
    for (const ch of c.choices) {
      const a = { finish: ch.finish_reason, text: ch.message.content };
      if (ch.finish_reason === "stop") {
        try {
          const v = JSON.parse(ch.message.content);
          const p = schema.safeParse(v);
          a.zod_ok = p.success;
          if (!p.success) a.zod_error = JSON.stringify(p.error.issues).slice(0, 400);
        } catch (err) {
          a.zod_ok = false;
          a.zod_error = "not JSON: " + err.message;
        }
      }
      r.answers.push(a);
    }
  } catch (err) {
    r.error = { status: err.status ?? null, message: String(err.message).slice(0, 400) };
  }
  out.cases[name] = r;
}

async function main() {
  for (const [name, schema] of Object.entries(CASES))
    await one(name, schema);
  // The OpenAI helper's own conversion of a zod (v3) schema.
  const Person = z3.object({ name: z3.string().max(8), age: z3.number().int(),
                             email: z3.string().email() });
  try {
    const p = await client.chat.completions.parse({
      model, messages: MESSAGES, temperature: 0, max_tokens: 300, logit_bias,
      response_format: zodResponseFormat(Person, "person") });
    const ch = p.choices[0];
    out.helper = { finish: ch.finish_reason, parsed: ch.message.parsed,
                   ok: ch.finish_reason !== "stop" ||
                       Person.safeParse(ch.message.parsed).success };
  } catch (err) {
    out.helper = { error: String(err.message).slice(0, 400) };
  }
  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
