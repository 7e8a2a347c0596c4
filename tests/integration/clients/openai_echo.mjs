// openai_echo.mjs — the prompt's log-probabilities (completions echo +
// logprobs, lm-evaluation-harness's request) through the official OpenAI
// Node client (npm `openai`) against the tangram daemon, for
// tests/integration/test_daemon_prompt_logprobs.py.
//
// usage: node openai_echo.mjs BASE_URL MODEL IDS_JSON
//
// Sends completions.create with the prompt as token ids, echo true,
// logprobs 1, max_tokens 1, temperature 0, and the same with max_tokens 0.
// Prints one JSON object with what the client parsed; the Python test
// judges it. Exits 1 only when the client threw.
import OpenAI from "openai";

const [baseURL, model, idsJson] = process.argv.slice(2);
if (!baseURL || !model || !idsJson) {
  console.error("usage: node openai_echo.mjs BASE_URL MODEL IDS_JSON");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || "none",
                            maxRetries: 0, timeout: 120000 });
const prompt = JSON.parse(idsJson);
const out = {};

function seen(r) {
  const c = r.choices[0];
  return { text: c.text, finish_reason: c.finish_reason,
           token_logprobs: c.logprobs.token_logprobs,
           tokens: c.logprobs.tokens, text_offset: c.logprobs.text_offset,
           top_logprobs: c.logprobs.top_logprobs, usage: r.usage };
}

async function main() {
  const req = { model, prompt, echo: true, logprobs: 1, max_tokens: 1,
                temperature: 0 };
  out.one = seen(await client.completions.create(req));
  out.zero = seen(await client.completions.create({ ...req, max_tokens: 0 }));
}

main().then(() => console.log(JSON.stringify(out)), (e) => {
  console.log(JSON.stringify({ error: String(e && e.stack || e) }));
  process.exit(1);
});
