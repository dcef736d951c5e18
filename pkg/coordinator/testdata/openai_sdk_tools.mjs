// Tool calls through the official OpenAI Node SDK; prints one JSON object
// that TestOpenAISDKTools checks. Environment as openai_sdk.mjs.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const model = process.env.PDSERVE_MODEL;
const out = {};
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] }, celsius: { type: 'boolean' } }, required: ['city', 'celsius'] },
  },
}];
const messages = [{ role: 'user', content: 'Weather in Paris?' }];

// Round trip: a required call, its result sent back, the next reply.
{
  const r = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 100, temperature: 0 });
  const m = r.choices[0].message;
  const call = m.tool_calls?.[0];
  let args = null;
  try { args = JSON.parse(call.function.arguments); } catch (e) { args = null; }
  const next = await client.chat.completions.create({
    model, tools, max_tokens: 4, temperature: 0,
    messages: [...messages, m, { role: 'tool', tool_call_id: call.id, content: '21 degrees, sunny' }],
  });
  out.roundTrip = {
    finish: r.choices[0].finish_reason, content: m.content, calls: m.tool_calls.length, id: call.id, type: call.type,
    name: call.function.name, args, next: next.choices[0].finish_reason, nextRole: next.choices[0].message.role,
  };
}

// Streamed deltas, accumulated by the SDK's own ChatCompletionStream.
{
  const stream = client.chat.completions.stream({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false, max_tokens: 100, temperature: 1, seed: 4,
  });
  const events = [];
  stream.on('tool_calls.function.arguments.done', (e) => events.push({ name: e.name, index: e.index, arguments: e.arguments }));
  const f = await stream.finalChatCompletion();
  const m = f.choices[0].message;
  let args = null;
  try { args = JSON.parse(m.tool_calls[0].function.arguments); } catch (e) { args = null; }
  out.streamed = { finish: f.choices[0].finish_reason, calls: m.tool_calls.length, id: m.tool_calls[0].id, name: m.tool_calls[0].function.name, args, events };
}

console.log(JSON.stringify(out));
