// The Responses API through the official OpenAI Node SDK; prints one JSON
// object that TestOpenAISDKResponses checks. Environment as openai_sdk.mjs.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const model = process.env.PDSERVE_MODEL;
const out = {};
const tools = [{
  type: 'function', name: 'flag', strict: true,
  parameters: { type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'], additionalProperties: false },
}];

// A forced call, its output sent back with previous_response_id.
const r1 = await client.responses.create({ model, input: 'go', tools, tool_choice: 'required', parallel_tool_calls: false, max_output_tokens: 120, temperature: 0 });
const call = r1.output.find((o) => o.type === 'function_call');
let args = null;
try { args = JSON.parse(call.arguments); } catch (e) { args = null; }
out.create = { status: r1.status, object: r1.object, types: r1.output.map((o) => o.type), name: call?.name, args, callID: call?.call_id, usage: r1.usage };

// Streamed continuation: the SDK's stream helper assembles the events.
const stream = client.responses.stream({
  model, previous_response_id: r1.id, tools, tool_choice: 'auto', max_output_tokens: 8, temperature: 0,
  input: [{ type: 'function_call_output', call_id: call.call_id, output: 'on' }],
});
const types = [];
let seq = -1, ordered = true, ended = null;
for await (const ev of stream) {
  types.push(ev.type);
  if (ev.type === 'response.completed' || ev.type === 'response.incomplete') ended = ev.response;
  if (ev.sequence_number !== seq + 1) ordered = false;
  seq = ev.sequence_number;
}
// (SDK 6.x's finalResponse takes only response.completed's response;
// a turn cut by max_output_tokens ends with response.incomplete.)
const r2 = ended;
out.stream = { first: types[0], last: types[types.length - 1], ordered, status: r2.status, prev: r2.previous_response_id === r1.id, cached: r2.usage.input_tokens_details.cached_tokens };

// Stored: retrieve, list input items, delete, then a 404.
const got = await client.responses.retrieve(r2.id);
const items = await client.responses.inputItems.list(r2.id);
await client.responses.delete(r1.id);
let after = null;
try { await client.responses.retrieve(r1.id); } catch (e) { after = e.constructor.name + ' ' + e.status; }
out.stored = { same: got.id === r2.id && got.status === r2.status, items: items.data.map((i) => i.type), after };

// Refused, naming the parameter.
try { await client.responses.create({ model, input: 'x', background: true }); } catch (e) { out.refused = { status: e.status, param: e.param }; }
console.log(JSON.stringify(out));
