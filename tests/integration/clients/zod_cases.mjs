// zod_cases.mjs — the schemas zod writes for the common cases (number
// ranges, formats, patterns, records, tuples, intersections, unions,
// optional/nullable, array bounds, enums), shared by zod_structured.mjs
// (the OpenAI Node client) and sdk_structured.mjs (the AI SDK and
// LangChain.js). zod's v4 API: z.toJSONSchema writes draft 2020-12.
import { z } from "zod/v4";

export const CASES = {
  int: z.object({ n: z.int() }),
  int_range: z.object({ n: z.int().min(-5).max(40) }),
  positive: z.object({ x: z.number().positive() }),
  bounded: z.object({ x: z.number().min(0.5).max(2.25) }),
  multiple: z.object({ m: z.int().multipleOf(7).min(0).max(100) }),
  email: z.object({ e: z.email() }),
  uuid: z.object({ u: z.uuid() }),
  datetime: z.object({ d: z.iso.datetime() }),
  date: z.object({ d: z.iso.date() }),
  regex: z.object({ s: z.string().regex(/^[a-z]{2,5}$/) }),
  record: z.record(z.string(), z.number()),
  record_enum: z.record(z.enum(["a", "b"]), z.boolean()),
  tuple: z.tuple([z.string().max(5), z.int()]),
  intersection: z.intersection(z.looseObject({ a: z.string().max(4) }),
                               z.looseObject({ b: z.int() })),
  union: z.union([z.object({ kind: z.literal("x"), v: z.int() }),
                  z.object({ kind: z.literal("y"), w: z.boolean() })]),
  optional: z.object({ a: z.string().max(3).optional(), b: z.int().nullable() }),
  array: z.object({ xs: z.array(z.int()).min(1).max(3) }),
  enum: z.object({ c: z.enum(["red", "green", "blue"]) }),
};
