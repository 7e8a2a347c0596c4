// agents_responses.mjs — the OpenAI Agents SDK (npm `@openai/agents`)
// running an agent with a function tool against the tangram daemon (the
// Responses API, the SDK's default), for
// tests/integration/test_daemon_responses.py.
//
// usage: node agents_responses.mjs BASE_URL MODEL
//   env OPENAI_API_KEY: the daemon's key
//
// The agent must call its tool on the first turn (toolChoice naming it;
// the SDK resets the choice after the call), gets the tool's result and
// answers; run() returns the final output. Then a second run continuing
// the first by previousResponseId. Prints one JSON object; the Python test
// judges it. Exits 1 when the SDK threw.
import OpenAI from "openai";
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";

const [baseURL, modelName] = process.argv.slice(2);
if (!baseURL || !modelName) {
  console.error("usage: node agents_responses.mjs BASE_URL MODEL");
  process.exit(2);
}
setTracingDisabled(true);
setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                                    maxRetries: 0, timeout: 120000 }));
const calls = [];
const getWeather = tool({
  name: "get_weather",
  description: "Get the weather in a city.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => { calls.push(city); return `21 C in ${city}`; },
});
const agent = new Agent({
  name: "Weather", instructions: "You answer with the weather.", model: modelName,
  tools: [getWeather],
  modelSettings: { toolChoice: "get_weather", temperature: 0, maxTokens: 40 },
});
const out = {};
try {
  const r = await run(agent, "Weather in Paris?", { maxTurns: 4 });
  out.run = { finalOutput: r.finalOutput ?? null, calls,
              items: r.newItems.map((i) => i.type),
              lastResponseId: r.lastResponseId ?? null };
  const r2 = await run(agent, "And tomorrow?", { maxTurns: 4,
                                                previousResponseId: r.lastResponseId });
  out.run2 = { finalOutput: r2.finalOutput ?? null, calls,
               items: r2.newItems.map((i) => i.type),
               lastResponseId: r2.lastResponseId ?? null };
} catch (e) {
  out.error = String(e && e.stack || e);
  console.log(JSON.stringify(out));
  process.exit(1);
}
console.log(JSON.stringify(out));
