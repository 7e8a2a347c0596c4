/*
 * rt_grpc_reflect.c — gRPC server reflection (see rt_grpc_reflect.h).
 *
 * The FileDescriptorSet is read with proto/descriptor_index.proto, a
 * subset of descriptor.proto: FileSet keeps each file serialized (the
 * bytes protoc wrote are what clients get), File parses one for its names.
 * At registration every declared name goes into a symbol table (name ->
 * file) and every extension into an extension table; the dependencies of
 * each file are resolved to file indices. Requests then only look up and
 * copy pointers. Both reflection packages (v1, v1alpha) have the same
 * messages, so the v1 protobuf-c types serve both.
 */
#include "router/net/rt_grpc_reflect.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/net/rt_grpc_internal.h"
#include "proto/descriptor_index.pb-c.h"
#include "proto/reflection.pb-c.h"

/* A client that asks without reading: answers queued beyond this end the
 * stream (a full descriptor answer is some kilobytes). */
#define REFLECT_MAX_PENDING (4u << 20)

struct refl_file {
    const char *name;                  /* into `parsed` */
    const ProtobufCBinaryData *bytes;  /* into refl->set */
    Tangram__Descidx__File *parsed;
    size_t *deps;                      /* (n_deps) indices of direct imports */
    size_t n_deps;
};

struct refl_sym {
    char *name;                        /* fully qualified, no leading '.' */
    size_t file;
    int is_message;
};

struct refl_ext {
    char *extendee;                    /* fully qualified, no leading '.' */
    int32_t number;
    size_t file;
};

struct refl {
    Tangram__Descidx__FileSet *set;
    struct refl_file *files;           /* (n_files) */
    size_t n_files;
    struct refl_sym *syms;             /* (n_syms) */
    size_t n_syms, cap_syms;
    struct refl_ext *exts;             /* (n_exts) */
    size_t n_exts, cap_exts;
    struct rt_grpc_server *srv;
};

/* ---- the index ----------------------------------------------------------- */

void rt_grpc__reflect_free(void *reflection)
{
    struct refl *r = reflection;
    if (!r)
        return;
    for (size_t i = 0; i < r->n_syms; i++)
        free(r->syms[i].name);
    for (size_t i = 0; i < r->n_exts; i++)
        free(r->exts[i].extendee);
    for (size_t i = 0; i < r->n_files; i++) {
        if (r->files[i].parsed)
            tangram__descidx__file__free_unpacked(r->files[i].parsed, NULL);
        free(r->files[i].deps);
    }
    free(r->syms);
    free(r->exts);
    free(r->files);
    if (r->set)
        tangram__descidx__file_set__free_unpacked(r->set, NULL);
    free(r);
}

/* "scope.name" (or "name" in the empty scope), malloc'd. */
static char *qualify(const char *scope, const char *name)
{
    size_t a = strlen(scope), b = strlen(name);
    char *q = malloc(a + b + 2);
    if (!q)
        return NULL;
    if (a) {
        memcpy(q, scope, a);
        q[a++] = '.';
    }
    memcpy(q + a, name, b + 1);
    return q;
}

/* Adds symbol scope.name of `file`; returns 0 or TG_ENOMEM. */
static int sym_add(struct refl *r, const char *scope, const char *name,
                   size_t file, int is_message)
{
    if (!name || !name[0])
        return 0;
    if (TG_GROW(r->syms, &r->cap_syms, r->n_syms + 1))
        return TG_ENOMEM;
    char *q = qualify(scope, name);
    if (!q)
        return TG_ENOMEM;
    r->syms[r->n_syms++] = (struct refl_sym){q, file, is_message};
    return 0;
}

/* An extension field declared in `scope` of `file`: a symbol, and an entry
 * of the extension table. */
static int ext_add(struct refl *r, const char *scope,
                   const Tangram__Descidx__Field *f, size_t file)
{
    int rc = sym_add(r, scope, f->name, file, 0);
    if (rc != 0 || !f->extendee)
        return rc;
    if (TG_GROW(r->exts, &r->cap_exts, r->n_exts + 1))
        return TG_ENOMEM;
    const char *ext = f->extendee[0] == '.' ? f->extendee + 1 : f->extendee;
    char *copy = strdup(ext);
    if (!copy)
        return TG_ENOMEM;
    r->exts[r->n_exts++] = (struct refl_ext){copy, f->number, file};
    return 0;
}

/* An enum declared in `scope`: the enum, and its values in `scope` too
 * (protobuf gives enum values the scope of their enum, not the enum's
 * own name). */
static int enum_add(struct refl *r, const char *scope,
                    const Tangram__Descidx__Enum *e, size_t file)
{
    int rc = sym_add(r, scope, e->name, file, 0);
    for (size_t i = 0; rc == 0 && i < e->n_value; i++)
        rc = sym_add(r, scope, e->value[i]->name, file, 0);
    return rc;
}

static int message_add(struct refl *r, const char *scope,
                       const Tangram__Descidx__Message *m, size_t file)
{
    if (!m->name || !m->name[0])
        return 0;
    int rc = sym_add(r, scope, m->name, file, 1);
    if (rc != 0)
        return rc;
    /* The name string stays put when r->syms grows. */
    const char *full = r->syms[r->n_syms - 1].name;
    for (size_t i = 0; rc == 0 && i < m->n_field; i++)
        rc = sym_add(r, full, m->field[i]->name, file, 0);
    for (size_t i = 0; rc == 0 && i < m->n_oneof_decl; i++)
        rc = sym_add(r, full, m->oneof_decl[i]->name, file, 0);
    for (size_t i = 0; rc == 0 && i < m->n_enum_type; i++)
        rc = enum_add(r, full, m->enum_type[i], file);
    for (size_t i = 0; rc == 0 && i < m->n_extension; i++)
        rc = ext_add(r, full, m->extension[i], file);
    for (size_t i = 0; rc == 0 && i < m->n_nested_type; i++)
        rc = message_add(r, full, m->nested_type[i], file);
    return rc;
}

static int file_index(struct refl *r, size_t fi)
{
    const Tangram__Descidx__File *f = r->files[fi].parsed;
    const char *pkg = f->package ? f->package : "";
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < f->n_message_type; i++)
        rc = message_add(r, pkg, f->message_type[i], fi);
    for (size_t i = 0; rc == 0 && i < f->n_enum_type; i++)
        rc = enum_add(r, pkg, f->enum_type[i], fi);
    for (size_t i = 0; rc == 0 && i < f->n_extension; i++)
        rc = ext_add(r, pkg, f->extension[i], fi);
    for (size_t i = 0; rc == 0 && i < f->n_service; i++) {
        const Tangram__Descidx__Service *s = f->service[i];
        rc = sym_add(r, pkg, s->name, fi, 0);
        if (rc != 0 || !s->name || !s->name[0])
            continue;
        const char *svc = r->syms[r->n_syms - 1].name;
        for (size_t k = 0; rc == 0 && k < s->n_method; k++)
            rc = sym_add(r, svc, s->method[k]->name, fi, 0);
    }
    return rc;
}

static int find_file(const struct refl *r, const char *name, size_t *out)
{
    for (size_t i = 0; i < r->n_files; i++) {
        if (strcmp(r->files[i].name, name) == 0) {
            *out = i;
            return 0;
        }
    }
    return TG_ENOTFOUND;
}

static int build(struct refl *r, const uint8_t *set, size_t len, char *err,
                 size_t errlen)
{
    r->set = tangram__descidx__file_set__unpack(NULL, len, set);
    if (!r->set)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "the descriptor set does not parse");
    r->n_files = r->set->n_file;
    r->files = calloc(r->n_files ? r->n_files : 1, sizeof(*r->files));
    if (!r->files)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->n_files; i++) {
        struct refl_file *f = &r->files[i];
        f->bytes = &r->set->file[i];
        f->parsed = tangram__descidx__file__unpack(NULL, f->bytes->len,
                                                   f->bytes->data);
        if (!f->parsed || !f->parsed->name || !f->parsed->name[0])
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "file %zu of the descriptor set does not "
                              "parse or has no name", i);
        f->name = f->parsed->name;
    }
    for (size_t i = 0; i < r->n_files; i++) {
        struct refl_file *f = &r->files[i];
        f->n_deps = f->parsed->n_dependency;
        f->deps = calloc(f->n_deps ? f->n_deps : 1, sizeof(*f->deps));
        if (!f->deps)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        for (size_t k = 0; k < f->n_deps; k++)
            if (find_file(r, f->parsed->dependency[k], &f->deps[k]) != 0)
                return tg_err_set(err, errlen, TG_EFORMAT,
                                  "%s imports %s, which the descriptor set "
                                  "lacks (protoc --include_imports)",
                                  f->name, f->parsed->dependency[k]);
        if (file_index(r, i) != 0)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    return 0;
}

/* ---- answers --------------------------------------------------------------- */

typedef Grpc__Reflection__V1__ServerReflectionRequest Req;
typedef Grpc__Reflection__V1__ServerReflectionResponse Resp;

/* The oneof cases of requests (Q_) and responses (A_), shorter. */
#define Q_(x) GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_##x
#define A_(x) GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_##x

static void error_response(Resp *resp, Grpc__Reflection__V1__ErrorResponse *e,
                           char *buf, size_t cap, int code, const char *fmt,
                           ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    e->error_code = code;
    e->error_message = buf;
    resp->message_response_case = A_(ERROR_RESPONSE);
    resp->error_response = e;
}

/* Fills `out` (room for n_files entries) with file `fi` and its imports,
 * transitively, each once, the file first; returns the count. `seen` has
 * n_files bytes. */
static size_t closure(const struct refl *r, size_t fi, ProtobufCBinaryData *out,
                      size_t *queue, char *seen)
{
    memset(seen, 0, r->n_files);
    size_t n = 0, head = 0;
    queue[n++] = fi;
    seen[fi] = 1;
    while (head < n) {
        const struct refl_file *f = &r->files[queue[head++]];
        for (size_t k = 0; k < f->n_deps; k++) {
            if (!seen[f->deps[k]]) {
                seen[f->deps[k]] = 1;
                queue[n++] = f->deps[k];
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        out[i] = *r->files[queue[i]].bytes;
    return n;
}

/* The service names of the method table, each once ("/svc/method"). */
static size_t list_services(const struct rt_grpc_server *srv,
                            Grpc__Reflection__V1__ServiceResponse *items,
                            Grpc__Reflection__V1__ServiceResponse **ptrs,
                            char *names, size_t names_cap)
{
    size_t n = 0, used = 0;
    for (size_t i = 0; i < srv->n_methods; i++) {
        const char *svc = srv->methods[i].path + 1;
        size_t len = (size_t)(strchr(svc, '/') - svc);
        int dup = 0;
        for (size_t k = 0; k < n && !dup; k++)
            dup = strlen(items[k].name) == len &&
                  memcmp(items[k].name, svc, len) == 0;
        if (dup || used + len + 1 > names_cap)
            continue;
        memcpy(names + used, svc, len);
        names[used + len] = '\0';
        grpc__reflection__v1__service_response__init(&items[n]);
        items[n].name = names + used;
        ptrs[n] = &items[n];
        used += len + 1;
        n++;
    }
    return n;
}

static const struct refl_sym *sym_find(const struct refl *r, const char *name)
{
    if (name[0] == '.')
        name++;
    for (size_t i = 0; i < r->n_syms; i++)
        if (strcmp(r->syms[i].name, name) == 0)
            return &r->syms[i];
    return NULL;
}

/* Answers one request into `resp` and sends it. Returns 0, or -1 when the
 * call was finished instead (out of memory). */
static int answer(struct refl *r, struct rt_grpc_call *call, Req *req)
{
    Resp resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse er =
        GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    Grpc__Reflection__V1__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lsr =
        GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ExtensionNumberResponse enr =
        GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
    char ebuf[384];
    size_t nf = r->n_files ? r->n_files : 1, nm = r->srv->n_methods + 1;
    ProtobufCBinaryData *files = calloc(nf, sizeof(*files));
    size_t *queue = calloc(nf, sizeof(*queue));
    char *seen = calloc(nf, 1);
    Grpc__Reflection__V1__ServiceResponse *items = calloc(nm, sizeof(*items));
    Grpc__Reflection__V1__ServiceResponse **ptrs = calloc(nm, sizeof(*ptrs));
    size_t names_cap = 0;
    for (size_t i = 0; i < r->srv->n_methods; i++)
        names_cap += strlen(r->srv->methods[i].path) + 1;
    char *names = malloc(names_cap + 1);
    int32_t *numbers = calloc(r->n_exts + 1, sizeof(*numbers));
    uint8_t *buf = NULL;
    int rc = -1;
    if (!files || !queue || !seen || !items || !ptrs || !names || !numbers)
        goto out;
    resp.valid_host = req->host;
    resp.original_request = req;
    size_t fi;
    const struct refl_sym *sym;
    switch (req->message_request_case) {
    case Q_(LIST_SERVICES):
        lsr.n_service = list_services(r->srv, items, ptrs, names, names_cap);
        lsr.service = ptrs;
        resp.message_response_case = A_(LIST_SERVICES_RESPONSE);
        resp.list_services_response = &lsr;
        break;
    case Q_(FILE_BY_FILENAME):
    case Q_(FILE_CONTAINING_SYMBOL):
        if (req->message_request_case == Q_(FILE_BY_FILENAME)) {
            if (find_file(r, req->file_by_filename, &fi) != 0) {
                error_response(&resp, &er, ebuf, sizeof(ebuf),
                               RT_GRPC_NOT_FOUND, "unknown file '%.200s'",
                               req->file_by_filename);
                break;
            }
        } else {
            sym = sym_find(r, req->file_containing_symbol);
            if (!sym) {
                error_response(&resp, &er, ebuf, sizeof(ebuf),
                               RT_GRPC_NOT_FOUND, "unknown symbol '%.200s'",
                               req->file_containing_symbol);
                break;
            }
            fi = sym->file;
        }
        fdr.n_file_descriptor_proto = closure(r, fi, files, queue, seen);
        fdr.file_descriptor_proto = files;
        resp.message_response_case = A_(FILE_DESCRIPTOR_RESPONSE);
        resp.file_descriptor_response = &fdr;
        break;
    case Q_(FILE_CONTAINING_EXTENSION): {
        const Grpc__Reflection__V1__ExtensionRequest *x =
            req->file_containing_extension;
        const char *type = x->containing_type[0] == '.' ? x->containing_type + 1
                                                        : x->containing_type;
        const struct refl_ext *hit = NULL;
        for (size_t i = 0; i < r->n_exts && !hit; i++)
            if (r->exts[i].number == x->extension_number &&
                strcmp(r->exts[i].extendee, type) == 0)
                hit = &r->exts[i];
        if (!hit) {
            error_response(&resp, &er, ebuf, sizeof(ebuf), RT_GRPC_NOT_FOUND,
                           "no extension %d of '%.200s'", x->extension_number,
                           x->containing_type);
            break;
        }
        fdr.n_file_descriptor_proto = closure(r, hit->file, files, queue, seen);
        fdr.file_descriptor_proto = files;
        resp.message_response_case = A_(FILE_DESCRIPTOR_RESPONSE);
        resp.file_descriptor_response = &fdr;
        break;
    }
    case Q_(ALL_EXTENSION_NUMBERS_OF_TYPE):
        sym = sym_find(r, req->all_extension_numbers_of_type);
        if (!sym || !sym->is_message) {
            error_response(&resp, &er, ebuf, sizeof(ebuf), RT_GRPC_NOT_FOUND,
                           "unknown message type '%.200s'",
                           req->all_extension_numbers_of_type);
            break;
        }
        enr.base_type_name = sym->name;
        for (size_t i = 0; i < r->n_exts; i++)
            if (strcmp(r->exts[i].extendee, sym->name) == 0)
                numbers[enr.n_extension_number++] = r->exts[i].number;
        enr.extension_number = numbers;
        resp.message_response_case = A_(ALL_EXTENSION_NUMBERS_RESPONSE);
        resp.all_extension_numbers_response = &enr;
        break;
    default:
        error_response(&resp, &er, ebuf, sizeof(ebuf),
                       RT_GRPC_INVALID_ARGUMENT,
                       "the request asks nothing (set one of "
                       "message_request)");
        break;
    }
    size_t sz = grpc__reflection__v1__server_reflection_response__get_packed_size(
        &resp);
    buf = malloc(sz + 1);
    if (!buf)
        goto out;
    grpc__reflection__v1__server_reflection_response__pack(&resp, buf);
    rc = rt_grpc_call_send(call, buf, sz) == 0 ? 0 : -1;
out:
    free(buf);
    free(files);
    free(queue);
    free(seen);
    free(items);
    free(ptrs);
    free(names);
    free(numbers);
    if (rc != 0)
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED,
                            "out of memory for a reflection answer");
    return rc;
}

static void on_message(struct rt_grpc_call *call, const uint8_t *msg,
                       size_t len, void *ud)
{
    struct refl *r = ud;
    if (!msg) {
        rt_grpc_call_finish(call, RT_GRPC_OK, NULL);
        return;
    }
    if (rt_grpc_call_pending_bytes(call) > REFLECT_MAX_PENDING) {
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED,
                            "the client does not read the answers");
        return;
    }
    Req *req =
        grpc__reflection__v1__server_reflection_request__unpack(NULL, len, msg);
    if (!req) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "malformed ServerReflectionRequest");
        return;
    }
    answer(r, call, req);
    grpc__reflection__v1__server_reflection_request__free_unpacked(req, NULL);
}

/* Nothing to release per call; having a cancel callback keeps a handle
 * the client reset from lingering as a zombie. */
static void on_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    (void)ud;
}

static void h_info(struct rt_grpc_call *call, void *ud)
{
    rt_grpc_call_on_cancel(call, on_cancel, NULL);
    rt_grpc_call_on_message(call, on_message, ud);
}

int rt_grpc_reflect_register(struct rt_grpc_server *srv, const uint8_t *set,
                             size_t len, char *err, size_t errlen)
{
    if (srv->reflection)
        return tg_err_set(err, errlen, TG_EEXIST,
                          "reflection registered already");
    struct refl *r = calloc(1, sizeof(*r));
    if (!r)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    r->srv = srv;
    int rc = build(r, set, len, err, errlen);
    if (rc != 0) {
        rt_grpc__reflect_free(r);
        return rc;
    }
    static const char *const paths[] = {
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    };
    /* From here on the server owns `r` (a method may point at it even if
     * the second registration fails). */
    srv->reflection = r;
    for (size_t i = 0; rc == 0 && i < 2; i++)
        rc = rt_grpc_method_add(srv, paths[i], RT_GRPC_BIDI_STREAM, h_info, r,
                                err, errlen);
    return rc;
}
