// Drives a candor server with the Vercel AI SDK (5, 6 or 7) as a Node app would: with @ai-sdk/openai-compatible,
// with and without candor's metadataExtractor (candor_metadata.mjs, the snippet in docs/serving.md), or with
// @ai-sdk/openai's default model (the Responses API; "openai5", "openai6", "openai7").
// Usage: node ai_sdk.mjs 5|6|7|openai5|openai6|openai7 BASE_URL API_KEY QUESTION   -> one JSON line on stdout:
// {bare: {generate: CELL, stream: CELL}, extractor: {generate: CELL, stream: CELL}}, or {default: {...}} for openai*
// CELL: {text: what result.text / the text stream held, shown: the documented line's text,
//        finish_reason, error: the type of an exception or null, confidence: the confidence object or null}
import { candorMetadata } from "./candor_metadata.mjs";

const [which, baseURL, apiKey, question] = process.argv.slice(2);
const major = which.replace("openai", "");
const { generateText, streamText } = await import(`ai${major}`);
const COMPATIBLE = { 5: "openai-compatible1", 6: "openai-compatible2", 7: "openai-compatible3" };

async function model(metadataExtractor) {
  if (which.startsWith("openai")) {
    const { createOpenAI } = await import(`ai-sdk-openai${Number(major) - 3}`);
    return createOpenAI({ baseURL, apiKey })("candor");
  }
  const { OpenAICompatibleChatLanguageModel } = await import(COMPATIBLE[major]);
  return new OpenAICompatibleChatLanguageModel("candor", {
    provider: "candor.chat",
    url: ({ path }) => `${baseURL}${path}`,
    headers: () => ({ Authorization: `Bearer ${apiKey}` }),
    metadataExtractor,
  });
}

const request = { system: "Answer briefly.", prompt: question, maxOutputTokens: 64, maxRetries: 0 };

// @ai-sdk/openai has no metadata extractor: the confidence is on the raw Responses body it keeps (plain only).
const bodyConfidence = (result) => (which.startsWith("openai") ? result.response?.body?.confidence ?? null : null);

async function generate(m) {
  try {
    // AI SDK 7 keeps the response body only when asked (include.responseBody); 5 and 6 keep it by default.
    const result = await generateText({ model: m, ...request, include: { responseBody: true } });
    const candor = result.providerMetadata?.candor;
    return { text: result.text, shown: result.text || candor?.refusal || "", finish_reason: result.finishReason,
             error: null, confidence: candor?.confidence ?? bodyConfidence(result) };
  } catch (error) {
    return failure(error);
  }
}

function failure(error) {
  const status = error?.statusCode ?? error?.status;  // the server's HTTP status, as the Python cells say it
  const message = `${status ? `Error code: ${status} - ` : ""}${String(error?.message ?? error).split("\n")[0].slice(0, 300)}`;
  return { text: "", shown: "", finish_reason: null, error: error?.constructor?.name ?? String(error), message,
           confidence: null };
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
    return failure(error);
  }
}

const out = {};
const ways = which.startsWith("openai") ? [["default", undefined]] : [["bare", undefined], ["extractor", candorMetadata]];
for (const [name, extractor] of ways) {
  out[name] = { generate: await generate(await model(extractor)), stream: await stream(await model(extractor)) };
}
console.log(JSON.stringify(out));
