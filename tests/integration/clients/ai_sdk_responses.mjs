// ai_sdk_responses.mjs — the AI SDK (npm `ai`) with its OpenAI provider
// (`@ai-sdk/openai`, whose `openai(model)` speaks the Responses API)
// against the tangram daemon, for tests/integration/test_daemon_responses.py.
//
// usage: node ai_sdk_responses.mjs BASE_URL MODEL
//   env OPENAI_API_KEY: the daemon's key
//
// generateText, streamText, a tool the model must call (its result sent
// back in a second generateText with the conversation's messages, which the
// provider sends as items, or as item references to stored output) and
// generateObject with a zod schema. Prints one JSON object with what the
// SDK returned; the Python test judges it. Exits 1 when the SDK threw.
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, modelName] = process.argv.slice(2);
if (!baseURL || !modelName) {
  console.error("usage: node ai_sdk_responses.mjs BASE_URL MODEL");
  process.exit(2);
}
const openai = createOpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none" });
const model = openai(modelName);
const out = {};
try {
  const g = await generateText({ model, prompt: "Tell me a story.",
                                 maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
  out.generate = { text: g.text, finishReason: g.finishReason, usage: g.usage,
                   responseId: g.response?.id ?? null };

  const s = streamText({ model, prompt: "Stream a line.", maxOutputTokens: 8,
                         temperature: 0, maxRetries: 0 });
  let deltas = "";
  for await (const t of s.textStream) deltas += t;
  out.stream = { deltas, text: await s.text, finishReason: await s.finishReason };

  const tools = {
    get_weather: tool({
      description: "Get the weather in a city.",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => ({ city, temperature: 21 }),
    }),
  };
  const messages = [{ role: "user", content: "Weather in Paris?" }];
  const t1 = await generateText({
    model, messages, tools, toolChoice: { type: "tool", toolName: "get_weather" },
    maxOutputTokens: 60, temperature: 0, maxRetries: 0 });
  out.tool = { toolCalls: t1.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
               toolResults: t1.toolResults.map((r) => r.output), finishReason: t1.finishReason };
  const t2 = await generateText({
    model, messages: messages.concat(t1.response.messages), tools, toolChoice: "none",
    maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
  out.tool_result = { text: t2.text, finishReason: t2.finishReason, usage: t2.usage };

  const o = await generateObject({
    model, schema: z.object({ answer: z.enum(["yes", "no"]) }),
    prompt: "Answer yes or no.", maxOutputTokens: 40, temperature: 0, maxRetries: 0 });
  out.object = o.object;
} catch (e) {
  out.error = String(e && e.stack || e);
  if (e && e.responseBody) out.responseBody = e.responseBody;
  if (e && e.requestBodyValues) out.request = e.requestBodyValues;
  console.log(JSON.stringify(out));
  process.exit(1);
}
console.log(JSON.stringify(out));
