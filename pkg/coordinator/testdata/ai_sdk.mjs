// The AI SDK's generateObject with a zod 4 schema (.int() as in
// agents_sdk.mjs) through @ai-sdk/openai (its default model, the Responses
// API) and @ai-sdk/openai-compatible (chat completions with json_schema);
// prints one JSON object that TestAISDK checks. Environment as
// openai_sdk.mjs (PDSERVE_SDK_INT as in openai_sdk7.mjs).
import { generateObject } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';

const baseURL = process.env.OPENAI_BASE_URL, apiKey = process.env.OPENAI_API_KEY, model = process.env.PDSERVE_MODEL;
const days = process.env.PDSERVE_SDK_INT === '0' ? z.number() : z.number().int();
const City = z.enum(['Oslo', 'Paris', 'Rome']);
const Weather = z.object({ city: City, days, unit: z.enum(['c', 'f']), rain: z.boolean() });
const finite = (v) => typeof v === 'number' ? Number.isFinite(v)
  : Array.isArray(v) ? v.every(finite)
  : v && typeof v === 'object' ? Object.values(v).every(finite) : true;

async function object(name, languageModel) {
  try {
    const r = await generateObject({
      model: languageModel, schema: Weather, schemaName: 'weather',
      prompt: 'The weather in Oslo, as JSON.', temperature: 0, maxOutputTokens: 400, maxRetries: 0,
    });
    const parsed = Weather.safeParse(r.object);
    return { object: r.object, valid: parsed.success, finite: finite(r.object), finish: r.finishReason, usage: r.usage };
  } catch (e) {
    return { error: { name: e?.constructor?.name, message: String(e?.message ?? e), text: e?.text ?? null } };
  }
}

const openai = createOpenAI({ baseURL, apiKey });
const compatible = createOpenAICompatible({ name: 'pdserve', baseURL, apiKey, supportsStructuredOutputs: true });
const out = {
  responses: await object('responses', openai(model)),
  chat: await object('chat', compatible.chatModel(model)),
};
console.log(JSON.stringify(out));
