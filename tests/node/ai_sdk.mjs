// Drives a candor server with the Vercel AI SDK (5 or 6) and @ai-sdk/openai-compatible, as a Node app would,
// with and without candor's metadataExtractor (candor_metadata.mjs, the snippet in docs/serving.md).
// Usage: node ai_sdk.mjs 5|6 BASE_URL API_KEY QUESTION   -> one JSON line on stdout:
// {bare: {generate: CELL, stream: CELL}, extractor: {generate: CELL, stream: CELL}}
// CELL: {text: what result.text / the text stream held, shown: the documented line's text,
//        finish_reason, error: the type of an exception or null, confidence: the confidence object or null}
import { candorMetadata } from "./candor_metadata.mjs";

const [major, baseURL, apiKey, question] = process.argv.slice(2);
const { generateText, streamText } = await import(major === "5" ? "ai5" : "ai6");
const { OpenAICompatibleChatLanguageModel } = await import(major === "5" ? "openai-compatible1" : "openai-compatible2");

function model(metadataExtractor) {
  return new OpenAICompatibleChatLanguageModel("candor", {
    provider: "candor.chat",
    url: ({ path }) => `${baseURL}${path}`,
    headers: () => ({ Authorization: `Bearer ${apiKey}` }),
    metadataExtractor,
  });
}

const request = { system: "Answer briefly.", prompt: question, maxOutputTokens: 64, maxRetries: 0 };

async function generate(m) {
  try {
    const result = await generateText({ model: m, ...request });
    const candor = result.providerMetadata?.candor;
    return { text: result.text, shown: result.text || candor?.refusal || "", finish_reason: result.finishReason,
             error: null, confidence: candor?.confidence ?? null };
  } catch (error) {
    return { text: "", shown: "", finish_reason: null, error: error?.constructor?.name ?? String(error), confidence: null };
  }
}

async function stream(m) {
  try {
    let failure = null;
    const result = streamText({ model: m, ...request, onError: ({ error }) => { failure = error; } });
    let text = "";
    for await (const delta of result.textStream) text += delta;
    if (failure) throw failure;
    const candor = (await result.providerMetadata)?.candor;
    return { text, shown: text || candor?.refusal || "", finish_reason: await result.finishReason, error: null,
             confidence: candor?.confidence ?? null };
  } catch (error) {
    return { text: "", shown: "", finish_reason: null, error: error?.constructor?.name ?? String(error), confidence: null };
  }
}

const out = {};
for (const [name, extractor] of [["bare", undefined], ["extractor", candorMetadata]]) {
  out[name] = { generate: await generate(model(extractor)), stream: await stream(model(extractor)) };
}
console.log(JSON.stringify(out));
