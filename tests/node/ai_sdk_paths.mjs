// The agent paths of the client matrix with the Vercel AI SDK (5, 6 or 7), as a Node app writes them: a tool
// round trip (generateText with a tool and stopWhen), a structured output (generateObject on AI SDK 5,
// generateText's Output.object on 6 and 7) and a second turn after an abstention (response.messages as history).
// Usage: node ai_sdk_paths.mjs 5|6|7|openai5|openai6|openai7 ANSWERING_URL ABSTAIN_TEXT_URL ABSTAIN_REFUSAL_URL KEY
// -> one JSON line: {tool: CELL, structured: {MODE: CELL}, turn2: {text: CELL, refusal: CELL}}
// (the URLs end in /v1; "5", "6", "7": @ai-sdk/openai-compatible with candor's extractor; openai*: @ai-sdk/openai)
import { z } from "zod";
import { candorMetadata } from "./candor_metadata.mjs";

const [which, answering, abstainText, abstainRefusal, apiKey] = process.argv.slice(2);
const major = which.replace("openai", "");
const ai = await import(`ai${major}`);
const COMPATIBLE = { 5: "openai-compatible1", 6: "openai-compatible2", 7: "openai-compatible3" };
const SYSTEM = "Answer briefly.";

async function model(baseURL) {
  if (which.startsWith("openai")) {
    const { createOpenAI } = await import(`ai-sdk-openai${Number(major) - 3}`);
    return createOpenAI({ baseURL, apiKey })("candor");
  }
  const { OpenAICompatibleChatLanguageModel } = await import(COMPATIBLE[major]);
  return new OpenAICompatibleChatLanguageModel("candor", {
    provider: "candor.chat",
    url: ({ path }) => `${baseURL}${path}`,
    headers: () => ({ Authorization: `Bearer ${apiKey}` }),
    metadataExtractor: candorMetadata,
    supportsStructuredOutputs: true,
  });
}

// @ai-sdk/openai assumes OpenAI stored its earlier responses and sends them back as item_references; candor stores
// none, and its 400 names this option: with store false the provider sends the items themselves.
const OPTIONS = which.startsWith("openai") ? { providerOptions: { openai: { store: false } } } : {};

const shown = (result) => result.text || result.providerMetadata?.candor?.refusal || "";

async function attempt(run) {
  try {
    return { ...(await run()), exception: null };
  } catch (error) {
    const status = error?.statusCode ?? error?.status;  // the server's HTTP status, as the Python cells say it
  const message = `${status ? `Error code: ${status} - ` : ""}${String(error?.message ?? error).split("\n")[0].slice(0, 300)}`;
    return { shown: null, exception: error?.constructor?.name ?? String(error), error: message };
  }
}

const VALID = (name, args) =>
  name === "get_weather" && args && typeof args === "object" && Object.keys(args).join() === "city" &&
  typeof args.city === "string";

async function tool() {
  const received = [];
  const getWeather = ai.tool({
    description: "Get the current weather in a city.",
    inputSchema: z.object({ city: z.string().describe("The city's name.") }).strict(),
    execute: async ({ city }) => {
      received.push({ city });
      return "Sunny, 21 degrees Celsius.";
    },
  });
  // The first step forces the call (toolChoice "required": the app's choice); the step after the tool's result asks
  // for the answer (prepareStep: toolChoice "none"; under "auto" the 135M model calls the tool again).
  const result = await ai.generateText({
    model: await model(answering), system: SYSTEM, maxOutputTokens: 64, maxRetries: 0, ...OPTIONS,
    prompt: "What is the weather in Paris right now? Use the get_weather tool.",
    tools: { get_weather: getWeather }, toolChoice: "required", stopWhen: ai.stepCountIs(3),
    prepareStep: ({ stepNumber }) => (stepNumber === 0 ? {} : { toolChoice: "none" }),
  });
  const calls = result.steps.flatMap((s) => s.toolCalls).map((c) => ({
    name: c.toolName, arguments: c.input, valid: VALID(c.toolName, c.input) }));
  return { calls, tool_ran: received.length, shown: shown(result) };
}

const City = z.object({ city: z.string(), country: z.string() });
const STRUCTURED = "What is the capital of France? Give the city and its country.";

function parsedCell(value) {
  const ok = City.safeParse(value);
  return { parsed: ok.success, shown: JSON.stringify(value ?? null), refusal: null };
}

async function structured() {
  const request = { model: await model(answering), system: SYSTEM, prompt: STRUCTURED, maxOutputTokens: 64, maxRetries: 0,
                    ...OPTIONS };
  if (major === "5") {
    const result = await ai.generateObject({ ...request, schema: City });
    return { generateObject: parsedCell(result.object) };
  }
  const result = await ai.generateText({ ...request, output: ai.Output.object({ schema: City }) });
  return { "Output.object": parsedCell(result.output) };
}

async function turn2(url) {
  const m = await model(url);
  const request = { model: m, system: SYSTEM, maxOutputTokens: 64, maxRetries: 0, ...OPTIONS };
  const history = [{ role: "user", content: "What is the capital of France?" }];
  const first = await ai.generateText({ ...request, messages: history });
  history.push(...first.response.messages, { role: "user", content: "And what is the capital of Germany?" });
  const second = await ai.generateText({ ...request, messages: history });
  return { shown: shown(first), shown_second: shown(second) };
}

const out = { tool: await attempt(tool) };
const modes = await attempt(structured);
if (modes.exception) {
  out.structured = { [major === "5" ? "generateObject" : "Output.object"]: modes };
} else {
  delete modes.exception;
  out.structured = Object.fromEntries(Object.entries(modes).map(([k, cell]) => [k, { ...cell, exception: null }]));
}
out.turn2 = { text: await attempt(() => turn2(abstainText)), refusal: await attempt(() => turn2(abstainRefusal)) };
console.log(JSON.stringify(out));
