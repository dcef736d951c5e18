// gen.mjs writes the JSON Schemas that zod 4, the OpenAI Node SDK's zod
// helpers and the Agents SDK emit for the schemas below, one file each,
// for TestZodCorpus. It is not run by the tests. To regenerate, in an
// empty directory outside the repository:
//
//   npm install zod@4 openai@7 @openai/agents
//   node PATH/TO/gen.mjs OUTDIR
//
// Versions used for the committed files: versions.json.
import { writeFileSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import { zodResponseFormat, zodFunction } from 'openai/helpers/zod';
import { tool } from '@openai/agents';

const out = process.argv[2] ?? '.';
const require = createRequire(join(process.cwd(), 'x.js'));
// The Agents SDK's conversion of an output type is not exported; its
// file is found next to the package's entry point.
const { convertAgentOutputTypeToSerializable } = await import(
  pathToFileURL(join(dirname(require.resolve('@openai/agents-core')), 'utils', 'tools.mjs')).href);
const version = (p) => JSON.parse(readFileSync(join(process.cwd(), 'node_modules', p, 'package.json'), 'utf8')).version;

const Category = z.object({
  name: z.string(),
  get subcategories() {
    return z.array(Category);
  },
});
const Node = z.lazy(() => z.object({ value: z.number().int(), next: z.union([Node, z.null()]) }));
const Weather = z.object({
  city: z.string().min(1).max(64),
  days: z.number().int().min(1).max(14),
  units: z.enum(['celsius', 'fahrenheit']),
});
const Person = z.object({
  id: z.uuid(),
  email: z.email(),
  age: z.number().int().nonnegative(),
  score: z.number().min(0).max(1),
  born: z.iso.date(),
  seen: z.iso.datetime(),
  code: z.string().regex(/^[A-Z]{3}-[0-9]{4}$/),
  slug: z.string().regex(/^[a-z]+(-[a-z]+)*$/),
  tags: z.array(z.string().max(10)).min(1).max(5),
  nick: z.string().nullable(),
  rank: z.number().int().positive().optional(),
});
// OpenAI's strict structured outputs take no .optional(): .nullable().
const PersonStrict = Person.extend({ rank: z.number().int().positive().nullable() });

const schemas = {
  'int': z.object({ n: z.number().int() }),
  'int-range': z.object({ n: z.number().int().min(-5).max(300) }),
  'int-positive': z.object({ n: z.number().int().positive(), m: z.number().int().lt(10) }),
  'string-length': z.object({ s: z.string().min(3).max(8) }),
  'email': z.object({ e: z.email() }),
  'uuid': z.object({ u: z.uuid() }),
  'datetime': z.object({ t: z.iso.datetime() }),
  'date-time-parts': z.object({ d: z.iso.date(), t: z.iso.time() }),
  'regex': z.object({ code: z.string().regex(/^[A-Z]{3}-[0-9]{4}$/) }),
  'lazy-category': Category,
  'lazy-list': Node,
  'lazy-defs': z.object({ left: Category, right: Node.nullable() }),
  'person': Person,
  'discriminated': z.discriminatedUnion('kind', [
    z.object({ kind: z.literal('circle'), r: z.number() }),
    z.object({ kind: z.literal('square'), side: z.number().int().max(100) }),
  ]),
};

const files = {};
for (const [name, s] of Object.entries(schemas)) {
  files[`zod-${name}.json`] = z.toJSONSchema(s);
}
files['openai-response-format-person.json'] = zodResponseFormat(PersonStrict, 'person').json_schema.schema;
files['openai-response-format-category.json'] = zodResponseFormat(Category, 'category').json_schema.schema;
files['openai-function-weather.json'] = zodFunction({ name: 'get_weather', parameters: Weather }).function.parameters;
files['agents-tool-weather.json'] = tool({ name: 'get_weather', description: 'weather', parameters: Weather, execute: async () => '' }).parameters;
files['agents-output-person.json'] = convertAgentOutputTypeToSerializable(PersonStrict).schema;

for (const [f, s] of Object.entries(files)) {
  writeFileSync(join(out, f), JSON.stringify(s, null, 2) + '\n');
}
writeFileSync(join(out, 'versions.json'), JSON.stringify({
  zod: version('zod'), openai: version('openai'), '@openai/agents': version('@openai/agents'),
}, null, 2) + '\n');
