// sdk_structured.mjs — the schemas zod writes (zod_cases.mjs), served
// through the Vercel AI SDK (npm `ai` with `@ai-sdk/openai`, its chat
// model pointed at the tangram daemon) and LangChain.js (npm
// `@langchain/openai`), for tests/integration/test_daemon_zod.py.
//
// usage: node sdk_structured.mjs BASE_URL MODEL BIAS_JSON
//   BIAS_JSON: a logit_bias object ({"id": bias}) toward closing tokens,
//   so the random model's documents end (the mask still decides what is
//   allowed)
//
// Per case, as a user of each library writes it:
//   ai_object   generateObject({schema})            response_format json_schema
//   ai_stream   streamObject({schema})               the same, streamed
//   lc_json     withStructuredOutput(schema, {method: "jsonSchema"})
// and, for the object-rooted cases (a tool's arguments are an object):
//   ai_tool     generateText({tools, toolChoice: "required"})
//   lc_tool     withStructuredOutput(schema, {method: "functionCalling"})
// Each answer records how the request finished, whether the library
// accepted it and the zod schema itself validates it, and the document
// (text, or a tool's inputs) for the Python test to validate against the
// JSON Schema once more: every finished answer must pass all three. A library that threw for
// any reason other than an unfinished answer ("length") is a failure.
// Prints one JSON object; exits 1 only when the script itself broke.
import { generateObject, streamObject, generateText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod/v4";
import { CASES } from "./zod_cases.mjs";

const [baseURL, model, biasJson] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node sdk_structured.mjs BASE_URL MODEL BIAS_JSON");
  process.exit(2);
}
const logitBias = JSON.parse(biasJson || "{}");
const PROMPT = "Answer in JSON.";
const MAX = 300;

const provider = createOpenAI({ baseURL, apiKey: "none" });
const chat = provider.chat(model);
const common = { model: chat, prompt: PROMPT, temperature: 1.0, seed: 7,
                 maxOutputTokens: MAX, maxRetries: 0,
                 providerOptions: { openai: { logitBias } } };

function why(err) {
  return String(err && err.message ? err.message : err).slice(0, 300);
}

// The AI SDK reports an answer it could not accept as
// NoObjectGeneratedError with the finish reason and the text.
function aiFailure(err) {
  return { finish: err.finishReason ?? null, ok: false, text: err.text ?? null,
           error: err.name + ": " + why(err) };
}

async function aiObject(schema) {
  try {
    const r = await generateObject({ ...common, schema });
    return { finish: r.finishReason, ok: schema.safeParse(r.object).success,
             text: JSON.stringify(r.object) };
  } catch (err) {
    return aiFailure(err);
  }
}

async function aiStream(schema) {
  let streamErr = null;
  try {
    const r = streamObject({ ...common, schema,
                             onError: ({ error }) => { streamErr = error; } });
    let partials = 0;
    for await (const _ of r.partialObjectStream) partials++;
    const finish = await r.finishReason;
    try {
      const obj = await r.object;
      return { finish, ok: schema.safeParse(obj).success, partials,
               text: JSON.stringify(obj) };
    } catch (err) {
      return { ...aiFailure(err), finish, partials };
    }
  } catch (err) {
    return aiFailure(streamErr || err);
  }
}

async function aiTool(schema) {
  try {
    const r = await generateText({
      ...common,
      tools: { answer: tool({ description: "Give the answer.",
                              inputSchema: schema }) },
      toolChoice: "required" });
    const calls = r.toolCalls || [];
    const errors = (r.content || []).filter((p) => p.type === "tool-error");
    const ok = calls.length > 0 && errors.length === 0 &&
               calls.every((c) => !c.invalid &&
                                  schema.safeParse(c.input).success);
    return { finish: r.finishReason, ok, calls: calls.length,
             inputs: calls.map((c) => c.input),
             error: errors.length ? why(errors[0].error) : undefined };
  } catch (err) {
    return aiFailure(err);
  }
}

const lcModel = new ChatOpenAI({
  model, apiKey: "none", configuration: { baseURL }, temperature: 1.0,
  maxRetries: 0, maxTokens: MAX, logitBias, modelKwargs: { seed: 7 } });

async function lc(schema, method) {
  try {
    const s = lcModel.withStructuredOutput(schema, { method, strict: true,
                                                     includeRaw: true });
    const r = await s.invoke(PROMPT);
    const md = (r.raw && r.raw.response_metadata) || {};
    const finish = md.finish_reason ?? null;
    return { finish, ok: r.parsed != null && schema.safeParse(r.parsed).success,
             text: JSON.stringify(r.parsed ?? null) };
  } catch (err) {
    return { finish: null, ok: false, error: err.name + ": " + why(err) };
  }
}

async function main() {
  const out = { cases: {} };
  for (const [name, schema] of Object.entries(CASES)) {
    const js = z.toJSONSchema(schema);
    const c = { schema: js };
    c.ai_object = await aiObject(schema);
    c.ai_stream = await aiStream(schema);
    c.lc_json = await lc(schema, "jsonSchema");
    if (js.type === "object" && js.properties) {
      c.ai_tool = await aiTool(schema);
      c.lc_tool = await lc(schema, "functionCalling");
    }
    out.cases[name] = c;
  }
  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
