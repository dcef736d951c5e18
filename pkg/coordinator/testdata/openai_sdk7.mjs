// The OpenAI Node SDK 7's Responses API over HTTP and WebSocket mode, and
// chat.completions.parse with a zod 4 schema; prints one JSON object that
// TestOpenAISDK7 checks. Environment as openai_sdk.mjs.
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { ResponsesWebSocketSession } from 'openai/lib/responses/responses-websocket-session';
import { zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: process.env.OPENAI_API_KEY, maxRetries: 0, timeout: 120_000 });
const model = process.env.PDSERVE_MODEL;
const out = {};

// The schema of every structured case: an int (zod 4 writes it with
// minimum/maximum), enums, a boolean. PDSERVE_SDK_INT=0 makes
// days a plain number, to check the harness where a server refuses the
// range keywords.
const days = process.env.PDSERVE_SDK_INT === '0' ? z.number() : z.number().int();
// Strings are enums: random weights fill an unbounded string until the
// token limit.
const City = z.enum(['Oslo', 'Paris', 'Rome']);
const Weather = z.object({ city: City, days, unit: z.enum(['c', 'f']), rain: z.boolean() });
// finite reports whether every number in v is a finite double.
const finite = (v) => typeof v === 'number' ? Number.isFinite(v)
  : Array.isArray(v) ? v.every(finite)
  : v && typeof v === 'object' ? Object.values(v).every(finite) : true;
const check = (v) => {
  const r = Weather.safeParse(v);
  return { parsed: v ?? null, valid: r.success, finite: finite(v), issues: r.success ? [] : r.error.issues.map((i) => i.path.join('.') + ': ' + i.message) };
};
const errorOf = (e) => ({ name: e?.constructor?.name, status: e?.status, param: e?.param ?? e?.error?.param, code: e?.code ?? e?.error?.code, message: e?.message });

// responses.create, not streamed, with text.format from zod (the SDK's
// responses.parse parses output_text).
try {
  const r = await client.responses.parse({
    model, input: 'Weather in Oslo?', max_output_tokens: 120, temperature: 0,
    text: { format: zodTextFormat(Weather, 'weather') },
  });
  out.create = { status: r.status, object: r.object, id: r.id, types: r.output.map((o) => o.type), text: r.output_text, usage: r.usage, ...check(r.output_parsed) };
} catch (e) { out.create = { error: errorOf(e) }; }

// responses.create with a plain string input and instructions.
{
  const r = await client.responses.create({ model, instructions: 'Be brief.', input: 'Hello', max_output_tokens: 6, temperature: 0 });
  out.plain = { status: r.status, id: r.id, types: r.output.map((o) => o.type), text: r.output_text, role: r.output[0]?.role, usage: r.usage, incomplete: r.incomplete_details?.reason ?? null };
}

// responses.stream: the SDK's helper assembles the events and returns
// the final response.
{
  const stream = client.responses.stream({ model, input: 'Count to three.', max_output_tokens: 6, temperature: 0 });
  const types = [];
  let deltas = '', seq = -1, ordered = true;
  stream.on('response.output_text.delta', (ev) => { deltas += ev.delta; });
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.sequence_number !== seq + 1) ordered = false;
    seq = ev.sequence_number;
  }
  const final = await stream.finalResponse();
  out.stream = { first: types[0], last: types[types.length - 1], types: [...new Set(types)], ordered, deltas, text: final.output_text, status: final.status, id: final.id };
}

// WebSocket mode: one socket, response.create events, a continuation
// with previous_response_id on the socket, two stream_id lanes at once.
{
  const ws = new ResponsesWS(client);
  const raw = [];
  ws.on('event', (ev) => raw.push({ type: ev.type, stream_id: ev.stream_id ?? null, seq: ev.sequence_number }));
  await new Promise((resolve, reject) => {
    if (ws.socket.readyState === 1) return resolve();
    ws.socket.once('open', resolve);
    ws.socket.once('error', reject);
  });
  const session = new ResponsesWebSocketSession(ws, { maxLanes: 8, maxBufferedEvents: 10_000, maxBufferedBytes: 16 << 20 });
  const main = session.lane();
  main.create({ model, input: 'My name is Ada.', max_output_tokens: 4, temperature: 0 });
  const w1 = await main.finalResponse();
  main.create({ model, previous_response_id: w1.id, input: [{ role: 'user', content: 'What is my name?' }], max_output_tokens: 4, temperature: 0 });
  const w2 = await main.finalResponse();
  // Two lanes in flight at once; each lane's events carry its stream_id.
  const a = session.lane('lane-a'), b = session.lane('lane-b');
  a.create({ model, input: 'first', max_output_tokens: 5, temperature: 0 });
  b.create({ model, previous_response_id: w2.id, input: 'second', max_output_tokens: 3, temperature: 0 });
  const [ra, rb] = await Promise.all([a.finalResponse(), b.finalResponse()]);
  // A structured answer on the socket (zod's text.format).
  main.create({ model, input: 'Weather?', max_output_tokens: 120, temperature: 0, text: { format: zodTextFormat(Weather, 'weather') } });
  let structured;
  try {
    const ws4 = await main.finalResponse();
    structured = { status: ws4.status, ...check(JSON.parse(ws4.output_text)) };
  } catch (e) { structured = { error: e.error ?? String(e) }; }
  // An error event names the parameter, on its lane.
  const bad = session.lane('lane-bad');
  bad.create({ model, input: 'x', max_output_tokens: -1 });
  let refused = null;
  try { await bad.finalResponse(); } catch (e) { refused = { name: e.constructor.name, status: e.error?.status ?? null, param: e.error?.error?.param ?? null, type: e.error?.type ?? null, stream_id: e.error?.stream_id ?? null }; }
  session.close();
  ws.close({ code: 1000, reason: 'done' });
  const lanes = {};
  for (const ev of raw) (lanes[ev.stream_id ?? ''] ??= new Set()).add(ev.type);
  out.ws = {
    first: { id: w1.id, status: w1.status, text: w1.output_text, usage: w1.usage },
    cont: { id: w2.id, status: w2.status, prev: w2.previous_response_id, usage: w2.usage },
    laneA: { id: ra.id, status: ra.status, usage: ra.usage },
    laneB: { id: rb.id, status: rb.status, prev: rb.previous_response_id, usage: rb.usage },
    structured, refused,
    streams: Object.fromEntries(Object.entries(lanes).map(([k, v]) => [k, [...v]])),
    events: raw.length,
  };
}

// chat.completions.parse with zod 4 (zodResponseFormat).
try {
  const c = await client.chat.completions.parse({
    model, messages: [{ role: 'user', content: 'Weather in Paris?' }], max_tokens: 120, temperature: 0,
    response_format: zodResponseFormat(Weather, 'weather'),
  });
  const m = c.choices[0].message;
  out.parse = { finish: c.choices[0].finish_reason, content: m.content, ...check(m.parsed) };
} catch (e) { out.parse = { error: errorOf(e) }; }

console.log(JSON.stringify(out));
