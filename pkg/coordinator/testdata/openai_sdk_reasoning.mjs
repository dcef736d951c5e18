// Reasoning through the official OpenAI Node SDK; prints one JSON object
// that TestOpenAISDKReasoning checks. Environment as openai_sdk.mjs, and
// PDSERVE_RAW_PROMPT: the chat below as the template renders it.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const model = process.env.PDSERVE_MODEL;
const messages = [{ role: 'user', content: 'Why is the sky blue?' }];
const out = {};

{
  const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  const m = r.choices[0].message;
  out.whole = { reasoning: m.reasoning_content ?? null, content: m.content, finish: r.choices[0].finish_reason, completionTokens: r.usage.completion_tokens };
}
{
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stream: true });
  let reasoning = '', content = '', reasoningChunks = 0, finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta?.reasoning_content) { reasoning += c.delta.reasoning_content; reasoningChunks++; }
    if (c.delta?.content) content += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  out.streamed = { reasoning, content, reasoningChunks, finish };
}
{
  const r = await client.completions.create({ model, prompt: process.env.PDSERVE_RAW_PROMPT, max_tokens: 24, temperature: 0 });
  out.raw = { text: r.choices[0].text, completionTokens: r.usage.completion_tokens };
}
console.log(JSON.stringify(out));
