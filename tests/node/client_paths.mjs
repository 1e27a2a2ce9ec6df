// The agent paths of the client matrix with the official Node openai client, as its README writes them: a tool
// round trip (the assistant message appended as it came, then the tool's result), a structured output
// (response_format json_schema; Responses: text.format) and a second turn after an abstention, for chat
// completions and the Responses API.
// Usage: node client_paths.mjs ANSWERING_URL ABSTAIN_TEXT_URL ABSTAIN_REFUSAL_URL KEY   (URLs end in /v1)
// -> one JSON line: {chat: {tool, structured: {response_format: CELL}, turn2: {text, refusal}}, responses: {...}}
import OpenAI from "openai";

const [answering, abstainText, abstainRefusal, apiKey] = process.argv.slice(2);
const client = (baseURL) => new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const SYSTEM = "Answer briefly.";
const PARAMETERS = { type: "object", properties: { city: { type: "string", description: "The city's name." } },
                     required: ["city"], additionalProperties: false };
const TOOL = { type: "function", function: { name: "get_weather", description: "Get the current weather in a city.",
                                             parameters: PARAMETERS } };
const RESPONSES_TOOL = { type: "function", name: "get_weather", description: "Get the current weather in a city.",
                         parameters: PARAMETERS, strict: true };
const CITY = { type: "object", properties: { city: { type: "string" }, country: { type: "string" } },
               required: ["city", "country"], additionalProperties: false };
const TOOL_QUESTION = "What is the weather in Paris right now? Use the get_weather tool.";
const STRUCTURED = "What is the capital of France? Give the city and its country.";
const RESULT = "Sunny, 21 degrees Celsius.";

async function attempt(run) {
  try {
    return { ...(await run()), exception: null };
  } catch (error) {
    const status = error?.statusCode ?? error?.status;  // the server's HTTP status, as the Python cells say it
  const message = `${status ? `Error code: ${status} - ` : ""}${String(error?.message ?? error).split("\n")[0].slice(0, 300)}`;
    return { shown: null, exception: error?.constructor?.name ?? String(error), error: message };
  }
}

function call(name, text) {
  let args = text;
  try { args = JSON.parse(text); } catch { /* recorded as it came */ }
  const valid = name === "get_weather" && args && typeof args === "object" && Object.keys(args).join() === "city" &&
    typeof args.city === "string";
  return { name, arguments: args, valid };
}

function parsedCell(text, refusal) {
  let value = null;
  try { value = JSON.parse(text); } catch { /* not JSON */ }
  const parsed = !!value && typeof value.city === "string" && typeof value.country === "string" &&
    Object.keys(value).length === 2;
  return { parsed, shown: text ?? null, refusal: refusal ?? null };
}

const shownChat = (m) => m.content || m.refusal || "";
const shownResponses = (r) => r.output_text ||
  r.output.flatMap((i) => (i.type === "message" ? i.content : [])).filter((p) => p.type === "refusal")
    .map((p) => p.refusal).join("");

async function chatTool() {
  const c = client(answering);
  const messages = [{ role: "system", content: SYSTEM }, { role: "user", content: TOOL_QUESTION }];
  // The first step forces the call (tool_choice "required": the app's choice); the final answer is the model's.
  const first = (await c.chat.completions.create({ model: "candor", messages, tools: [TOOL], tool_choice: "required",
                                                   max_tokens: 64 })).choices[0];
  messages.push(first.message);
  let ran = 0;
  for (const tc of first.message.tool_calls ?? []) {
    ran += 1;
    messages.push({ role: "tool", tool_call_id: tc.id, content: RESULT });
  }
  // The step after the tool's result asks for the answer (tool_choice "none"; under "auto" the 135M model calls again).
  const final = (await c.chat.completions.create({ model: "candor", messages, tools: [TOOL], tool_choice: "none",
                                                   max_tokens: 64 })).choices[0];
  const calls = (first.message.tool_calls ?? []).map((tc) => call(tc.function.name, tc.function.arguments));
  return { calls, tool_ran: ran, shown: shownChat(final.message) };
}

async function chatStructured() {
  const messages = [{ role: "system", content: SYSTEM }, { role: "user", content: STRUCTURED }];
  const response_format = { type: "json_schema", json_schema: { name: "City", schema: CITY, strict: true } };
  const m = (await client(answering).chat.completions.create({ model: "candor", messages, response_format,
                                                               max_tokens: 64 })).choices[0].message;
  return parsedCell(m.content, m.refusal);
}

async function chatTurn2(url) {
  const c = client(url);
  const messages = [{ role: "system", content: SYSTEM }, { role: "user", content: "What is the capital of France?" }];
  const first = (await c.chat.completions.create({ model: "candor", messages, max_tokens: 64 })).choices[0].message;
  messages.push(first, { role: "user", content: "And what is the capital of Germany?" });
  const second = (await c.chat.completions.create({ model: "candor", messages, max_tokens: 64 })).choices[0].message;
  return { shown: shownChat(first), shown_second: shownChat(second) };
}

async function responsesTool() {
  const c = client(answering);
  const request = { model: "candor", instructions: SYSTEM, tools: [RESPONSES_TOOL], max_output_tokens: 64 };
  const input = [{ role: "user", content: TOOL_QUESTION }];
  const first = await c.responses.create({ ...request, input, tool_choice: "required" });
  const called = first.output.filter((o) => o.type === "function_call");
  input.push(...first.output);
  for (const fc of called) input.push({ type: "function_call_output", call_id: fc.call_id, output: RESULT });
  const final = await c.responses.create({ ...request, input, tool_choice: "none" });
  return { calls: called.map((fc) => call(fc.name, fc.arguments)), tool_ran: called.length, shown: shownResponses(final) };
}

async function responsesStructured() {
  const text = { format: { type: "json_schema", name: "City", schema: CITY, strict: true } };
  const r = await client(answering).responses.create({ model: "candor", input: STRUCTURED, text, max_output_tokens: 64 });
  return parsedCell(r.output_text || null, shownResponses(r) || null);
}

async function responsesTurn2(url) {
  const c = client(url);
  const request = { model: "candor", instructions: SYSTEM, max_output_tokens: 64 };
  const input = [{ role: "user", content: "What is the capital of France?" }];
  const first = await c.responses.create({ ...request, input });
  input.push(...first.output, { role: "user", content: "And what is the capital of Germany?" });
  const second = await c.responses.create({ ...request, input });
  return { shown: shownResponses(first), shown_second: shownResponses(second) };
}

const out = {
  chat: { tool: await attempt(chatTool), structured: { response_format: await attempt(chatStructured) },
          turn2: { text: await attempt(() => chatTurn2(abstainText)), refusal: await attempt(() => chatTurn2(abstainRefusal)) } },
  responses: { tool: await attempt(responsesTool), structured: { "text.format": await attempt(responsesStructured) },
               turn2: { text: await attempt(() => responsesTurn2(abstainText)),
                        refusal: await attempt(() => responsesTurn2(abstainRefusal)) } },
};
console.log(JSON.stringify(out));
