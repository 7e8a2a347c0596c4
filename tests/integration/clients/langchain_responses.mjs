// langchain_responses.mjs — LangChain's ChatOpenAI with useResponsesApi
// (npm `@langchain/openai`) against the tangram daemon, for
// tests/integration/test_daemon_responses.py.
//
// usage: node langchain_responses.mjs BASE_URL MODEL
//   env OPENAI_API_KEY: the daemon's key
//
// invoke, stream, a tool bound with tool_choice naming it (the call comes
// back as tool_calls), and the tool's result sent back in the messages.
// Prints one JSON object; the Python test judges it. Exits 1 when
// LangChain threw.
import { ChatOpenAI } from "@langchain/openai";
import { HumanMessage, ToolMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { z } from "zod";

const [baseURL, modelName] = process.argv.slice(2);
if (!baseURL || !modelName) {
  console.error("usage: node langchain_responses.mjs BASE_URL MODEL");
  process.exit(2);
}
const llm = new ChatOpenAI({
  model: modelName, useResponsesApi: true, temperature: 0, maxTokens: 8,
  maxRetries: 0, apiKey: process.env.OPENAI_API_KEY || "none",
  configuration: { baseURL },
});
const out = {};
try {
  const m = await llm.invoke("Tell me a story.");
  out.invoke = { text: m.text, id: m.id ?? null,
                 usage: m.usage_metadata ?? null };
  let streamed = "";
  for await (const c of await llm.stream("Stream a line.")) streamed += c.text;
  out.stream = { text: streamed };
  const getWeather = tool(async ({ city }) => `21 C in ${city}`, {
    name: "get_weather", description: "Get the weather in a city.",
    schema: z.object({ city: z.string() }) });
  const llm60 = new ChatOpenAI({
    model: modelName, useResponsesApi: true, temperature: 0, maxTokens: 60,
    maxRetries: 0, apiKey: process.env.OPENAI_API_KEY || "none",
    configuration: { baseURL },
  });
  const withTools = llm60.bindTools([getWeather], { tool_choice: "get_weather" });
  const q = new HumanMessage("Weather in Paris?");
  const a = await withTools.invoke([q]);
  out.tool_calls = a.tool_calls.map((c) => ({ name: c.name, args: c.args, id: c.id }));
  if (a.tool_calls.length > 0) {
    const res = await getWeather.invoke(a.tool_calls[0]);
    const b = await llm.invoke([q, a, res]);
    out.tool_result = { text: b.text };
  }
} catch (e) {
  out.error = String(e && e.stack || e);
  console.log(JSON.stringify(out));
  process.exit(1);
}
console.log(JSON.stringify(out));
