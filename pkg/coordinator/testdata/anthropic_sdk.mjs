// The Messages API through the official Anthropic TypeScript SDK; prints
// one JSON object that TestAnthropicSDK checks. Environment: ANTHROPIC_SDK
// (the package's directory), ANTHROPIC_BASE_URL (the server, without
// /v1), ANTHROPIC_API_KEY, PDSERVE_MODEL.
const { default: Anthropic } = await import(process.env.ANTHROPIC_SDK + '/index.mjs');

const client = new Anthropic({ baseURL: process.env.ANTHROPIC_BASE_URL, apiKey: process.env.ANTHROPIC_API_KEY, maxRetries: 0, timeout: 60_000 });
const model = process.env.PDSERVE_MODEL;
const out = {};
const shape = (m) => ({
  id: m.id, type: m.type, role: m.role, model: m.model, stop_reason: m.stop_reason, stop_sequence: m.stop_sequence,
  usage: m.usage, blocks: m.content.map((b) => ({ type: b.type, text: b.text, id: b.id, name: b.name, input: b.input })),
});

// messages.create, whole.
{
  const m = await client.messages.create({
    model, max_tokens: 8, system: 'Answer briefly.', temperature: 0,
    messages: [{ role: 'user', content: 'Hello there' }],
  });
  out.create = shape(m);
}

// messages.stream: the SDK's MessageStream assembles the events.
{
  // Greedy: sampled, the random-weight model's first token is sometimes
  // its end (0 output tokens), and the Messages API has no seed.
  const stream = client.messages.stream({ model, max_tokens: 8, messages: [{ role: 'user', content: 'Tell me a story' }], temperature: 0 });
  const events = [];
  let text = '';
  stream.on('streamEvent', (e) => events.push(e.type));
  stream.on('text', (d) => { text += d; });
  const m = await stream.finalMessage();
  out.stream = { ...shape(m), events, text };
}

// A tool-use round trip: a forced call, its result sent back, the reply.
{
  const tools = [{
    name: 'get_weather', description: 'Weather of a city',
    input_schema: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'] },
  }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const m = await client.messages.create({ model, max_tokens: 200, tools, tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true }, messages, temperature: 0 });
  const use = m.content.find((b) => b.type === 'tool_use');
  const next = await client.messages.create({
    model, max_tokens: 4, tools, temperature: 0,
    messages: [...messages, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 degrees, sunny' }] }],
  });
  // Streamed, the SDK builds the tool input from input_json_delta.
  const s = client.messages.stream({ model, max_tokens: 200, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true }, messages, temperature: 1 });
  let partial = '';
  s.on('inputJson', (d) => { partial += d; });
  const sm = await s.finalMessage();
  out.tools = { call: shape(m), next: shape(next), streamed: shape(sm), partial };
}

// Errors: a refused parameter and an unknown model, typed by the SDK.
for (const [name, params] of [
  ['topK', { model, max_tokens: 4, top_k: 5, messages: [{ role: 'user', content: 'hi' }] }],
  ['unknownModel', { model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }],
]) {
  try {
    await client.messages.create(params);
    out[name] = { raised: 'nothing' };
  } catch (e) {
    out[name] = {
      raised: e.constructor.name, status: e.status, type: e.error?.error?.type, message: e.error?.error?.message,
      badRequest: e instanceof Anthropic.BadRequestError, notFound: e instanceof Anthropic.NotFoundError,
    };
  }
}

console.log(JSON.stringify(out));
