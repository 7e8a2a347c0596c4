/* test_openai_invalid.c — the OpenAI API module's refusals
 * (router/api/rt_openai.h): a table of invalid requests at every endpoint,
 * each with its code, HTTP status, param and a part of its message; a
 * failed parse leaves nothing behind (tt_openai_parse). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai.h"
#include "tests/support/tt_openai.h"

/* The tables' short names of the endpoints. */
#define C TT_EP_COMPLETION
#define H TT_EP_CHAT
#define T TT_EP_TOKENIZE
#define D TT_EP_DETOKENIZE

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

struct bad_case {
    enum tt_ep ep;
    const char *body;
    int status;
    int rc;
    const char *param; /* "" = null */
    const char *msg;   /* substring of the message */
};

static const struct bad_case BAD[] = {
    /* body and JSON */
    {C, "", 400, TG_EFORMAT, "", "body is empty"},
    {C, "{", 400, TG_EFORMAT, "", "malformed JSON"},
    {C, "{\"prompt\":\"hi\",}", 400, TG_EFORMAT, "", "malformed JSON"},
    {C, "[1,2]", 400, TG_EFORMAT, "", "must be a JSON object"},
    {C, "\"prompt\"", 400, TG_EFORMAT, "", "malformed JSON"},
    {C, "{\"prompt\":\"a\\u0000b\"}", 400, TG_EFORMAT, "", "malformed JSON"},
    {C, "{\"prompt\":\"hi\"} trailing", 400, TG_EFORMAT, "", "malformed"},
    /* model */
    {C, "{\"model\":\"gpt-4\",\"prompt\":\"hi\"}", 404, TG_ENOTFOUND, "model",
     "'gpt-4' does not exist"},
    {C, "{\"model\":5,\"prompt\":\"hi\"}", 400, TG_EFORMAT, "model",
     "must be a string"},
    {H, "{\"model\":\"Tiny\"," MSG "}", 404, TG_ENOTFOUND, "model",
     "serves 'tiny'"},
    /* prompt */
    {C, "{}", 400, TG_EFORMAT, "prompt", "'prompt' is required"},
    {C, "{\"prompt\":null}", 400, TG_EFORMAT, "prompt", "is required"},
    {C, "{\"prompt\":\"\"}", 400, TG_EFORMAT, "prompt", "must not be empty"},
    {C, "{\"prompt\":[]}", 400, TG_EFORMAT, "prompt", "must not be empty"},
    {C, "{\"prompt\":[\"\"]}", 400, TG_EFORMAT, "prompt[0]",
     "must not be empty"},
    {C, "{\"prompt\":[[]]}", 400, TG_EFORMAT, "prompt[0]", "must not be empty"},
    {C, "{\"prompt\":[\"a\",\"b\"],\"stream\":true}", 400, TG_EUNSUPPORTED,
     "stream", "a batch of prompts is answered whole"},
    {C, "{\"prompt\":[[1],[2]],\"n\":2}", 400, TG_EUNSUPPORTED, "n",
     "takes n = 1"},
    {C, "{\"prompt\":[1,-2]}", 400, TG_ERANGE, "prompt[1]",
     "is not a token id"},
    {C, "{\"prompt\":[1,1000]}", 400, TG_ERANGE, "prompt[1]", "0..999"},
    {C, "{\"prompt\":[1,\"a\"]}", 400, TG_EFORMAT, "prompt[1]",
     "integer token id"},
    {C, "{\"prompt\":[1,2.5]}", 400, TG_EFORMAT, "prompt[1]",
     "integer token id"},
    {C, "{\"prompt\":{\"a\":1}}", 400, TG_EFORMAT, "prompt",
     "must be a string"},
    {C, "{\"prompt\":7}", 400, TG_EFORMAT, "prompt", "must be a string"},
    {C, "{\"prompt\":[true]}", 400, TG_EFORMAT, "prompt[0]",
     "a string or an array of token ids"},
    /* n in [1, RT_OPENAI_MAX_N]; best_of only equal to n */
    {C, "{\"prompt\":\"hi\",\"n\":0}", 400, TG_ERANGE, "n",
     "between 1 and 16, got 0"},
    {C, "{\"prompt\":\"hi\",\"n\":17}", 400, TG_ERANGE, "n",
     "between 1 and 16, got 17"},
    {C, "{\"prompt\":\"hi\",\"n\":-1}", 400, TG_ERANGE, "n", "got -1"},
    {C, "{\"prompt\":\"hi\",\"n\":2.5}", 400, TG_EFORMAT, "n",
     "must be an integer"},
    {C, "{\"prompt\":\"hi\",\"n\":\"1\"}", 400, TG_EFORMAT, "n",
     "must be an integer"},
    {H, "{" MSG ",\"n\":100}", 400, TG_ERANGE, "n", "got 100"},
    {C, "{\"prompt\":\"hi\",\"best_of\":3}", 400, TG_EUNSUPPORTED, "best_of",
     "must equal 'n' (1; got 3)"},
    {C, "{\"prompt\":\"hi\",\"n\":2,\"best_of\":3}", 400, TG_EUNSUPPORTED,
     "best_of", "must equal 'n' (2; got 3)"},
    {H, "{" MSG ",\"n\":3,\"best_of\":1}", 400, TG_EUNSUPPORTED, "best_of",
     "(3; got 1)"},
    {H, "{" MSG ",\"echo\":true}", 400, TG_EUNSUPPORTED, "echo",
     "a /v1/completions parameter"},
    {C,
     "{\"prompt\":\"hi\",\"echo\":true,\"logprobs\":0,"
     "\"stream\":true}",
     400, TG_EUNSUPPORTED, "echo", "cannot be streamed"},
    {C, "{\"prompt\":\"hi\",\"echo\":true,\"logprobs\":1,\"n\":2}", 400,
     TG_EUNSUPPORTED, "echo", "only with n = 1"},
    {C, "{\"prompt\":\"hi\",\"prompt_logprobs\":21}", 400, TG_ERANGE,
     "prompt_logprobs", ""},
    {H, "{" MSG ",\"prompt_logprobs\":1,\"stream\":true}", 400, TG_EUNSUPPORTED,
     "prompt_logprobs", "cannot be streamed"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, TG_ERANGE, "max_tokens",
     ""},
    {C, "{\"prompt\":\"hi\",\"echo\":true,\"max_tokens\":0,\"n\":2}", 400,
     TG_EUNSUPPORTED, "max_tokens", "only with n = 1"},
    {C, "{\"prompt\":\"hi\",\"echo\":\"no\"}", 400, TG_EFORMAT, "echo",
     "must be a boolean"},
    {C, "{\"prompt\":\"hi\",\"suffix\":\"x\"}", 400, TG_EUNSUPPORTED, "suffix",
     "not supported"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"1000\":1}}", 400, TG_ERANGE,
     "logit_bias.1000", "valid: 0..999"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"-1\":1}}", 400, TG_ERANGE,
     "logit_bias.-1", "not a token id"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"abc\":1}}", 400, TG_ERANGE,
     "logit_bias.abc", "not a token id"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"5x\":1}}", 400, TG_ERANGE,
     "logit_bias.5x", "not a token id"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":100.5}}", 400, TG_ERANGE,
     "logit_bias.5", "[-100, 100]"},
    {H, "{" MSG ",\"logit_bias\":{\"5\":-101}}", 400, TG_ERANGE, "logit_bias.5",
     "[-100, 100]"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":\"1\"}}", 400, TG_EFORMAT,
     "logit_bias.5", "a number"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"7\":1,\"07\":2}}", 400, TG_EINVAL,
     "logit_bias", "token 7 twice"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":[1]}", 400, TG_EFORMAT, "logit_bias",
     "must be an object"},
    {C, "{\"prompt\":\"hi\",\"response_format\":{\"type\":\"grammar\"}}", 400,
     TG_EUNSUPPORTED, "response_format.type", "not supported"},
    {H, "{" MSG ",\"response_format\":{\"type\":\"json_schema\"}}", 400,
     TG_EFORMAT, "response_format.json_schema", "needs"},
    {H,
     "{" MSG ",\"response_format\":{\"type\":\"json_schema\","
     "\"json_schema\":{\"name\":\"x\"}}}",
     400, TG_EFORMAT, "response_format.json_schema.schema", "needs"},
    {H,
     "{" MSG ",\"response_format\":{\"type\":\"json_schema\","
     "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
     "\"array\",\"uniqueItems\":true}}}}",
     400, TG_EUNSUPPORTED, "response_format.json_schema.schema", "uniqueItems"},
    {H,
     "{" MSG ",\"response_format\":{\"type\":\"json_schema\","
     "\"json_schema\":{\"name\":\"x\",\"strict\":1,"
     "\"schema\":{}}}}",
     400, TG_EFORMAT, "response_format.json_schema.strict", "a boolean"},
    {H, "{" MSG ",\"response_format\":{\"type\":5}}", 400, TG_EFORMAT,
     "response_format.type", "a string"},
    /* max_tokens, min_tokens */
    {C, "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, TG_ERANGE, "max_tokens",
     "between 1 and 128, got 0"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":-5}", 400, TG_ERANGE, "max_tokens",
     "got -5"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":129}", 400, TG_ERANGE, "max_tokens",
     "between 1 and 128"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":\"16\"}", 400, TG_EFORMAT,
     "max_tokens", "must be an integer"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":1.5}", 400, TG_EFORMAT, "max_tokens",
     "must be an integer"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":1e30}", 400, TG_ERANGE, "max_tokens",
     "between 1 and 128, got 1e+30 (beyond 64 bits)"},
    {H, "{" MSG ",\"max_completion_tokens\":0}", 400, TG_ERANGE,
     "max_completion_tokens", "between 1 and 128"},
    {H, "{" MSG ",\"max_tokens\":5,\"max_completion_tokens\":\"x\"}", 400,
     TG_EFORMAT, "max_completion_tokens", "must be an integer"},
    {C, "{\"prompt\":\"hi\",\"min_tokens\":20,\"max_tokens\":10}", 400,
     TG_ERANGE, "min_tokens", "must not exceed 'max_tokens' (10)"},
    {C, "{\"prompt\":\"hi\",\"min_tokens\":-1}", 400, TG_ERANGE, "min_tokens",
     "got -1"},
    /* sampling numbers */
    {C, "{\"prompt\":\"hi\",\"temperature\":-0.1}", 400, TG_ERANGE,
     "temperature", "must be in [0, 2]"},
    {C, "{\"prompt\":\"hi\",\"temperature\":2.5}", 400, TG_ERANGE,
     "temperature", "got 2.5"},
    {C, "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, TG_EFORMAT,
     "temperature", "must be a number"},
    {H, "{" MSG ",\"temperature\":true}", 400, TG_EFORMAT, "temperature",
     "must be a number"},
    {C, "{\"prompt\":\"hi\",\"top_p\":0}", 400, TG_ERANGE, "top_p",
     "must be in (0, 1]"},
    {C, "{\"prompt\":\"hi\",\"top_p\":1.1}", 400, TG_ERANGE, "top_p", "(0, 1]"},
    {C, "{\"prompt\":\"hi\",\"top_k\":-2}", 400, TG_ERANGE, "top_k",
     "at least -1"},
    {C, "{\"prompt\":\"hi\",\"top_k\":[1]}", 400, TG_EFORMAT, "top_k",
     "must be an integer"},
    {C, "{\"prompt\":\"hi\",\"min_p\":1.5}", 400, TG_ERANGE, "min_p", "[0, 1]"},
    {C, "{\"prompt\":\"hi\",\"presence_penalty\":-3}", 400, TG_ERANGE,
     "presence_penalty", "[-2, 2]"},
    {C, "{\"prompt\":\"hi\",\"frequency_penalty\":2.01}", 400, TG_ERANGE,
     "frequency_penalty", "got 2.01"},
    {C, "{\"prompt\":\"hi\",\"repetition_penalty\":0}", 400, TG_ERANGE,
     "repetition_penalty", "greater than 0"},
    {C, "{\"prompt\":\"hi\",\"repetition_penalty\":-1}", 400, TG_ERANGE,
     "repetition_penalty", "greater than 0"},
    {C, "{\"prompt\":\"hi\",\"seed\":\"x\"}", 400, TG_EFORMAT, "seed",
     "must be an integer"},
    {C, "{\"prompt\":\"hi\",\"seed\":0.5}", 400, TG_EFORMAT, "seed",
     "must be an integer"},
    /* stop */
    {C, "{\"prompt\":\"hi\",\"stop\":5}", 400, TG_EFORMAT, "stop",
     "a string or an array of strings"},
    {C, "{\"prompt\":\"hi\",\"stop\":\"\"}", 400, TG_EFORMAT, "stop",
     "must not be an empty string"},
    {C, "{\"prompt\":\"hi\",\"stop\":[\"a\",\"\"]}", 400, TG_EFORMAT, "stop[1]",
     "must not be an empty string"},
    {C, "{\"prompt\":\"hi\",\"stop\":[\"a\",1]}", 400, TG_EFORMAT, "stop[1]",
     "must be a string"},
    {C,
     "{\"prompt\":\"hi\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\","
     "\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\","
     "\"17\"]}",
     400, TG_ERANGE, "stop", "at most 16"},
    {C, "{\"prompt\":\"hi\",\"stop_token_ids\":[5,-1]}", 400, TG_ERANGE,
     "stop_token_ids[1]", "is not a token id"},
    {C, "{\"prompt\":\"hi\",\"stop_token_ids\":\"5\"}", 400, TG_EFORMAT,
     "stop_token_ids", "an array of token ids"},
    /* booleans */
    {C, "{\"prompt\":\"hi\",\"ignore_eos\":1}", 400, TG_EFORMAT, "ignore_eos",
     "must be a boolean"},
    {C, "{\"prompt\":\"hi\",\"skip_special_tokens\":\"true\"}", 400, TG_EFORMAT,
     "skip_special_tokens", "must be a boolean"},
    {C, "{\"prompt\":\"hi\",\"add_special_tokens\":0}", 400, TG_EFORMAT,
     "add_special_tokens", "must be a boolean"},
    /* logprobs */
    {C, "{\"prompt\":\"hi\",\"logprobs\":21}", 400, TG_ERANGE, "logprobs",
     "between 0 and 20, got 21"},
    {C, "{\"prompt\":\"hi\",\"logprobs\":-1}", 400, TG_ERANGE, "logprobs",
     "between 0 and 20"},
    {C, "{\"prompt\":\"hi\",\"logprobs\":true}", 400, TG_EFORMAT, "logprobs",
     "must be an integer"},
    {H, "{" MSG ",\"logprobs\":\"yes\"}", 400, TG_EFORMAT, "logprobs",
     "must be a boolean"},
    {H, "{" MSG ",\"logprobs\":5}", 400, TG_EFORMAT, "logprobs",
     "must be a boolean"},
    {H, "{" MSG ",\"top_logprobs\":5}", 400, TG_EFORMAT, "top_logprobs",
     "requires 'logprobs' to be true"},
    {H, "{" MSG ",\"logprobs\":true,\"top_logprobs\":21}", 400, TG_ERANGE,
     "top_logprobs", "between 0 and 20"},
    {H, "{" MSG ",\"logprobs\":true,\"top_logprobs\":-1}", 400, TG_ERANGE,
     "top_logprobs", "got -1"},
    /* stream */
    {C, "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, TG_EFORMAT, "stream",
     "must be a boolean"},
    {C, "{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":true}}", 400,
     TG_EFORMAT, "stream_options", "only allowed when 'stream' is true"},
    {C, "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":[]}", 400,
     TG_EFORMAT, "stream_options", "must be an object"},
    {H, "{" MSG ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
     400, TG_EFORMAT, "stream_options.include_usage", "must be a boolean"},
    /* identity */
    {C, "{\"prompt\":\"hi\",\"user\":7}", 400, TG_EFORMAT, "user",
     "must be a string"},
    {C, "{\"prompt\":\"hi\",\"session_id\":\"\"}", 400, TG_EFORMAT,
     "session_id", "must not be empty"},
    {H, "{" MSG ",\"session_id\":[]}", 400, TG_EFORMAT, "session_id",
     "must be a string"},
    /* chat messages */
    {H, "{}", 400, TG_EFORMAT, "messages", "'messages' is required"},
    {H, "{\"messages\":\"hi\"}", 400, TG_EFORMAT, "messages",
     "must be an array"},
    {H, "{\"messages\":[]}", 400, TG_EFORMAT, "messages",
     "at least one message"},
    {H, "{\"messages\":[5]}", 400, TG_EFORMAT, "messages[0]",
     "must be an object"},
    {H, "{\"messages\":[{\"content\":\"x\"}]}", 400, TG_EFORMAT,
     "messages[0].role", "is required"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
     "{\"role\":\"bot\",\"content\":\"x\"}]}",
     400, TG_EFORMAT, "messages[1].role", "must be one of"},
    {H, "{\"messages\":[{\"role\":3,\"content\":\"x\"}]}", 400, TG_EFORMAT,
     "messages[0].role", "must be a string"},
    {H, "{\"messages\":[{\"role\":\"user\"}]}", 400, TG_EFORMAT,
     "messages[0].content", "is required"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, TG_EFORMAT,
     "messages[0].content", "a string or an array of content parts"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
     "\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
     400, TG_EUNSUPPORTED, "messages[0].content[0].type",
     "'image_url' is not supported"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}"
     "]}",
     400, TG_EFORMAT, "messages[0].content[0].text", "must be a string"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", 400,
     TG_EFORMAT, "messages[0].content[0]", "must be an object"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}",
     400, TG_EFORMAT, "messages[0].content[0].type", "must be a string"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
     "{\"role\":\"tool\",\"content\":\"r\"}]}",
     400, TG_EFORMAT, "messages[1].tool_call_id", "is required"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"name\":5}]}",
     400, TG_EFORMAT, "messages[0].name", "must be a string"},
    {H,
     "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\","
     "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\"}]}]}",
     400, TG_EFORMAT, "messages[0].tool_calls[0].function",
     "must be an object"},
    {H,
     "{\"messages\":[{\"role\":\"assistant\",\"content\":null,"
     "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"arguments\":\"{}\"}}]}]}",
     400, TG_EFORMAT, "messages[0].tool_calls[0].id", "non-empty string"},
    {H,
     "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
     "\"c\",\"type\":\"code\",\"function\":{\"name\":\"f\","
     "\"arguments\":\"{}\"}}]}]}",
     400, TG_EFORMAT, "messages[0].tool_calls[0].type", "\"function\""},
    {H,
     "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
     "\"c\",\"function\":{\"name\":\"\",\"arguments\":\"{}\"}}]}]}",
     400, TG_EFORMAT, "messages[0].tool_calls[0].function.name",
     "non-empty string"},
    {H,
     "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
     "\"c\",\"function\":{\"name\":\"f\",\"arguments\":3}}]}]}",
     400, TG_EFORMAT, "messages[0].tool_calls[0].function.arguments",
     "a JSON string"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":"
     "[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}"
     "]}]}",
     400, TG_EFORMAT, "messages[0].tool_calls", "only assistant"},
    {H, "{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}", 400,
     TG_EFORMAT, "messages[0].content", "is required"},
    {H, "{\"messages\":[{\"role\":\"assistant\",\"function_call\":{}}]}", 400,
     TG_EUNSUPPORTED, "messages[0].function_call", "tool_calls"},
    {H, "{" MSG ",\"tools\":{}}", 400, TG_EFORMAT, "tools", "must be an array"},
    {H, "{" MSG ",\"tools\":[3]}", 400, TG_EFORMAT, "tools[0]",
     "must be an object"},
    {H, "{" MSG ",\"tools\":[{\"type\":\"retrieval\"}]}", 400, TG_EFORMAT,
     "tools[0].type", "\"function\""},
    {H, "{" MSG ",\"tools\":[{\"type\":\"function\"}]}", 400, TG_EFORMAT,
     "tools[0].function", "must be an object"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"bad name\"}}]}",
     400, TG_EFORMAT, "tools[0].function.name", "1 to 64 characters"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":[]}}]}",
     400, TG_EFORMAT, "tools[0].function.parameters", "JSON Schema object"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"description\":1}}]}",
     400, TG_EFORMAT, "tools[0].function.description", "must be a string"},
    {H, "{" MSG ",\"tool_choice\":\"required\"}", 400, TG_EFORMAT,
     "tool_choice", "has no 'tools'"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"g\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\"}}}",
     400, TG_EFORMAT, "tool_choice.function.name", "not among 'tools'"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\"}}}",
     400, TG_EUNSUPPORTED, "tool_choice", "no tool-call format"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"strict\":true}}]}",
     400, TG_EUNSUPPORTED, "tools[0].function.strict", "tool-call format"},
    {H,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\"}}],\"tool_choice\":{\"type\":\"tool\"}}",
     400, TG_EFORMAT, "tool_choice.type", "must be"},
    {H, "{" MSG ",\"tool_choice\":\"sometimes\"}", 400, TG_EFORMAT,
     "tool_choice", "must be"},
    {H, "{" MSG ",\"parallel_tool_calls\":1}", 400, TG_EFORMAT,
     "parallel_tool_calls", "must be a boolean"},
    {H, "{" MSG ",\"chat_template_kwargs\":{\"messages\":[]}}", 400, TG_EFORMAT,
     "chat_template_kwargs.messages", "set by the request"},
    {H, "{" MSG ",\"functions\":[{\"name\":\"f\"}]}", 400, TG_EUNSUPPORTED,
     "functions", "not supported"},
    {H,
     "{" MSG ",\"add_generation_prompt\":true,"
     "\"continue_final_message\":true}",
     400, TG_EFORMAT, "continue_final_message", "cannot both be true"},
    {H, "{" MSG ",\"chat_template_kwargs\":5}", 400, TG_EFORMAT,
     "chat_template_kwargs", "must be an object"},
    {H, "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", 400,
     TG_EFORMAT, "chat_template_kwargs.enable_thinking", "must be a boolean"},
    {H, "{" MSG ",\"chat_template\":\"{{x}}\"}", 400, TG_EUNSUPPORTED,
     "chat_template", "custom chat templates"},
    /* tokenize / detokenize */
    {T, "{}", 400, TG_EFORMAT, "prompt", "either 'prompt' or 'messages'"},
    {T, "{\"prompt\":5}", 400, TG_EFORMAT, "prompt", "must be a string"},
    {T, "{\"messages\":[]}", 400, TG_EFORMAT, "messages",
     "at least one message"},
    {T, "{\"prompt\":\"x\",\"add_special_tokens\":\"no\"}", 400, TG_EFORMAT,
     "add_special_tokens", "must be a boolean"},
    {T, "{\"model\":\"big\",\"prompt\":\"x\"}", 404, TG_ENOTFOUND, "model",
     "does not exist"},
    {T, "nope", 400, TG_EFORMAT, "", "malformed JSON"},
    {D, "{}", 400, TG_EFORMAT, "tokens", "'tokens' is required"},
    {D, "{\"tokens\":\"1 2\"}", 400, TG_EFORMAT, "tokens",
     "an array of token ids"},
    {D, "{\"tokens\":[1,1000]}", 400, TG_ERANGE, "tokens[1]",
     "is not a token id"},
    {D, "{\"tokens\":[0.5]}", 400, TG_EFORMAT, "tokens[0]", "integer token id"},
};

static void test_invalid_table(void **state)
{
    (void)state;
    size_t n = sizeof(BAD) / sizeof(BAD[0]);
    assert_true(n >= 40);
    for (size_t i = 0; i < n; i++) {
        const struct bad_case *b = &BAD[i];
        struct rt_request_error e;
        memset(&e, 0, sizeof(e));
        int rc = tt_openai_parse(b->ep, b->body, strlen(b->body), &e);
        if (rc != b->rc || rt_openai_http_status(e.kind) != b->status ||
            strcmp(e.param, b->param) != 0 ||
            strstr(e.message, b->msg) == NULL) {
            print_error("case %zu: %s\n  rc %d (want %d) status %d (want %d) "
                        "param '%s' (want '%s')\n  message: %s\n  want: %s\n",
                        i, b->body, rc, b->rc, rt_openai_http_status(e.kind),
                        b->status, e.param, b->param, e.message, b->msg);
            fail();
        }
        assert_string_equal(rt_openai_error_type(e.kind),
                            "invalid_request_error");
        assert_non_null(e.code);
        if (b->status == 404)
            assert_string_equal(e.code, "model_not_found");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
