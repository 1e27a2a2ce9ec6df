// Drives a candor server with the official Node openai client, as a Node app would.
// Usage: node client.mjs BASE_URL API_KEY QUESTION   -> one JSON line on stdout:
// {plain: {content, refusal, finish_reason, confidence}, streamed: {content, refusal, finish_reason, confidence}}
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
console.log(JSON.stringify(out));
