// Drives a candor server with the official Node openai client, as a Node app would.
// Usage: node client.mjs BASE_URL API_KEY QUESTION   -> one JSON line on stdout:
// {plain: {content, refusal, finish_reason, confidence}, streamed: {...the same},
//  responses: {content, refusal, finish_reason: the status, confidence}, responses_streamed: {...the same}}
// (the Responses API through client.responses.create, with the same system prompt as instructions)
import OpenAI from "openai";

const [baseURL, apiKey, question] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const messages = [{ role: "system", content: "Answer briefly." }, { role: "user", content: question }];

const plain = await client.chat.completions.create({ model: "candor", messages, max_tokens: 400 });
const choice = plain.choices[0];
const out = { plain: { content: choice.message.content, refusal: choice.message.refusal ?? null,
                       finish_reason: choice.finish_reason, confidence: choice.confidence } };

const stream = await client.chat.completions.create({ model: "candor", messages, max_tokens: 400, stream: true });
const streamed = { content: "", refusal: null, finish_reason: null, confidence: null };
for await (const chunk of stream) {
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta?.content) streamed.content += c.delta.content;
  if (c.delta?.refusal) streamed.refusal = (streamed.refusal ?? "") + c.delta.refusal;
  if (c.finish_reason) streamed.finish_reason = c.finish_reason;
  if (c.confidence) streamed.confidence = c.confidence;
}
out.streamed = streamed;

const request = { model: "candor", instructions: "Answer briefly.", input: question, max_output_tokens: 400 };
const resp = await client.responses.create(request);
const part = resp.output[0]?.content?.[0] ?? {};
out.responses = { content: resp.output_text, refusal: part.type === "refusal" ? part.refusal : null,
                  finish_reason: resp.status, confidence: resp.confidence };
const events = await client.responses.create({ ...request, stream: true });
const seen = { content: "", refusal: null, finish_reason: null, confidence: null };
for await (const event of events) {
  if (event.type === "response.output_text.delta") seen.content += event.delta;
  if (event.type === "response.refusal.done") seen.refusal = event.refusal;
  if (event.type === "response.completed" || event.type === "response.incomplete") {
    seen.finish_reason = event.response.status;
    seen.confidence = event.response.confidence;
  }
}
out.responses_streamed = seen;
console.log(JSON.stringify(out));
