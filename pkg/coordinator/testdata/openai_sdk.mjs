// Drives a pdserve server with the official OpenAI Node SDK and prints one
// JSON object with what each case saw; TestOpenAISDK checks it. runSDK
// runs it with the pinned Node.js beside the installed packages (make
// sdk); the server is OPENAI_BASE_URL.
import OpenAI, { BadRequestError, NotFoundError } from 'openai';

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const model = process.env.PDSERVE_MODEL;
const out = {};

// Streamed chat: the text of the deltas, the finish reason, the usage chunk.
{
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, stream: true,
    stream_options: { include_usage: true }, seed: 1,
  });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  out.chatStream = { text, finish, usage, chunks };
}

// Streamed completion with logprobs and n = 2, interleaved by index.
{
  const stream = await client.completions.create({
    model, prompt: 'The quick brown fox', max_tokens: 6, n: 2, logprobs: 2, temperature: 0.8, seed: 7, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true,
  });
  const choices = {};
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const ch = (choices[c.index] ??= { text: '', tokens: [], token_logprobs: [], top: [], finish: null });
      ch.text += c.text;
      if (c.logprobs) {
        ch.tokens.push(...c.logprobs.tokens);
        ch.token_logprobs.push(...c.logprobs.token_logprobs);
        ch.top.push(...c.logprobs.top_logprobs);
      }
      if (c.finish_reason) ch.finish = c.finish_reason;
    }
  }
  out.completionStream = { choices, usage };
}

// Chat with logprobs, not streamed.
{
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, logprobs: true, top_logprobs: 3, temperature: 0,
    ignore_eos: true, // vLLM's extension, sent as given: the random-weight model may end at once otherwise
  });
  out.chatLogprobs = { content: r.choices[0].logprobs?.content ?? null, text: r.choices[0].message.content, usage: r.usage };
}

// Echo with logprobs (lm-evaluation-harness's loglikelihood request).
{
  const r = await client.completions.create({ model, prompt: 'abc def', max_tokens: 1, echo: true, logprobs: 1, temperature: 0, ignore_eos: true });
  out.echo = { text: r.choices[0].text, logprobs: r.choices[0].logprobs };
}

// Structured output: response_format json_schema through the SDK's
// helpers, chat.completions.parse (greedy; message.parsed is the SDK's
// JSON.parse of the content) and chat.completions.stream (sampled; the
// SDK parses streams only for zod formats, so the final content is
// JSON.parse'd here), each checked against the schema by validate below.
const placeSchema = {
  type: 'object',
  properties: {
    city: { enum: ['Zürich', 'Lisbon', 'Osaka'] },
    population: { type: 'integer' },
    coastal: { type: 'boolean' },
    tags: { type: 'array', items: { enum: ['old', 'new'] }, maxItems: 2 },
  },
  required: ['city', 'population', 'coastal'],
  additionalProperties: false,
};

// validate returns the ways v breaks schema (the keywords placeSchema
// uses), [] when it validates.
function validate(schema, v, path = '$') {
  const errs = [];
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) errs.push(`${path}: not one of ${JSON.stringify(schema.enum)}`);
  switch (schema.type) {
    case 'object':
      if (typeof v !== 'object' || v === null || Array.isArray(v)) return [`${path}: not an object`];
      for (const k of schema.required ?? []) if (!(k in v)) errs.push(`${path}: ${k} missing`);
      for (const [k, x] of Object.entries(v)) {
        if (schema.properties?.[k]) errs.push(...validate(schema.properties[k], x, `${path}.${k}`));
        else if (schema.additionalProperties === false) errs.push(`${path}: ${k} not allowed`);
      }
      break;
    case 'array':
      if (!Array.isArray(v)) return [`${path}: not an array`];
      if (schema.maxItems !== undefined && v.length > schema.maxItems) errs.push(`${path}: more than ${schema.maxItems} items`);
      v.forEach((x, i) => errs.push(...validate(schema.items ?? {}, x, `${path}[${i}]`)));
      break;
    case 'integer':
      if (!Number.isInteger(v)) errs.push(`${path}: not an integer`);
      break;
    case 'boolean':
      if (typeof v !== 'boolean') errs.push(`${path}: not a boolean`);
      break;
  }
  return errs;
}
{
  const response_format = { type: 'json_schema', json_schema: { name: 'place', strict: true, schema: placeSchema } };
  const messages = [{ role: 'user', content: 'Name a city as JSON.' }];
  const r = await client.chat.completions.parse({ model, messages, max_tokens: 400, temperature: 0, response_format });
  const m = r.choices[0].message;
  const stream = client.chat.completions.stream({ model, messages, max_tokens: 400, temperature: 1, seed: 3, response_format });
  let deltas = '';
  stream.on('content.delta', ({ delta }) => { deltas += delta; });
  const f = await stream.finalChatCompletion();
  const sm = f.choices[0].message;
  let sparsed = null;
  try { sparsed = JSON.parse(sm.content); } catch (e) { sparsed = null; }
  out.structured = {
    parsed: { content: m.content, parsed: m.parsed, finish: r.choices[0].finish_reason, errors: validate(placeSchema, m.parsed) },
    streamed: { content: sm.content, deltas, parsed: sparsed, finish: f.choices[0].finish_reason, errors: validate(placeSchema, sparsed) },
    // The validator refuses what breaks the schema, four ways here.
    refused: validate(placeSchema, { city: 'Paris', population: 1.5, extra: true }),
  };
}

// Errors the SDK raises as typed exceptions.
async function failure(f) {
  try {
    await f();
    return { raised: null };
  } catch (e) {
    return { raised: e.constructor.name, status: e.status, code: e.code ?? null, param: e.param ?? null,
      badRequest: e instanceof BadRequestError, notFound: e instanceof NotFoundError };
  }
}
out.overflow = await failure(() => client.completions.create({ model, prompt: 'x', max_tokens: 1_000_000 }));
out.unknownModel = await failure(() => client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }));

console.log(JSON.stringify(out));
