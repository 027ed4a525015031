/* Many generation requests on one model from C: an interactive and a background request
 * submitted together, streamed token by token through callbacks, and a third request
 * cancelled from its own token callback.
 *
 *   requests MODEL.gguf
 *
 * The callbacks run on the library's event thread (one per hs_requests handle), never at
 * the same time: the per-request buffers below need no lock, only the count of finished
 * requests the main thread waits on. Exit 0 when both requests finished with text, the
 * third ended cancelled, and nothing was left alive. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"

/* One request's state, its callbacks' user data. */
typedef struct request {
    const char *label;
    char text[4096];
    size_t len;
    unsigned pieces;
    hs_status status;
    char result[1024];
    int cancel_on_first_token;
    hs_requests *engine;
} request;

static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_wake = PTHREAD_COND_INITIALIZER;
static int done = 0;

/* hs_token_fn: `len` bytes of UTF-8 (NUL-terminated too), valid for the call only;
 * `sample` is always 0 here (each request asks for one sample). */
static void on_token(void *user_data, uint64_t id, uint32_t sample, const char *text, size_t len) {
    request *r = user_data;
    (void)sample;
    if (r->len + len < sizeof r->text) {
        memcpy(r->text + r->len, text, len);
        r->len += len;
        r->text[r->len] = 0;
    }
    if (r->pieces++ == 0 && r->cancel_on_first_token) {
        /* Callbacks may cancel (and submit); only hs_requests_close is refused here. */
        CHECK(hs_requests_cancel(r->engine, id));
    }
}

/* hs_finish_fn: the request's last call. */
static void on_finish(void *user_data, uint64_t id, hs_status status, const char *json) {
    request *r = user_data;
    r->status = status;
    snprintf(r->result, sizeof r->result, "%s", json);
    printf("[%s, request %llu] %s: \"%s\"\n  %s\n", r->label, (unsigned long long)id,
           hs_status_name(status), r->text, json);
    pthread_mutex_lock(&done_lock);
    done++;
    pthread_cond_signal(&done_wake);
    pthread_mutex_unlock(&done_lock);
}

static uint64_t submit(hs_requests *engine, request *r, const char *prompt, uint32_t max_tokens,
                       uint8_t priority) {
    hs_request_options options = {
        .max_tokens = max_tokens,
        .temperature = 0.0f, /* greedy */
        .top_k = 0,
        .top_p = 1.0f,
        .seed = 0,
        .priority = priority,
        .n = 1,
        .stop = NULL, /* no stop strings */
        .stop_count = 0,
        .on_token = on_token,
        .on_finish = on_finish,
        .user_data = r,
    };
    uint64_t id = 0;
    r->engine = engine;
    CHECK(hs_requests_submit(engine, prompt, &options, &id));
    return id;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    /* Two compute threads; chunks of 8 prompt tokens, so the interactive request
     * preempts the background prefill at the next 8-token boundary. */
    hs_requests_limits limits = {.kv_budget_bytes = 0, .max_requests = 8, .refuse_when_full = 0,
                                 .threads = 2, .chunk_len = 8};
    if (example_abi_mismatch()) return 1;
    hs_requests *engine = NULL;
    CHECK(hs_requests_open(argv[1], &limits, &engine));

    static request background = {.label = "background"}, interactive = {.label = "interactive"},
                   cancelled = {.label = "cancelled", .cancel_on_first_token = 1};
    submit(engine, &background,
           "Once upon a time, in a small village by the sea, there lived an old fisherman who "
           "every morning",
           24, HS_PRIORITY_BACKGROUND);
    submit(engine, &interactive, "The capital of France is", 12, HS_PRIORITY_INTERACTIVE);
    submit(engine, &cancelled, "Count from one to one hundred:", 200, HS_PRIORITY_INTERACTIVE);

    pthread_mutex_lock(&done_lock);
    while (done < 3) pthread_cond_wait(&done_wake, &done_lock);
    pthread_mutex_unlock(&done_lock);

    char *metrics = NULL;
    CHECK(hs_requests_metrics_json(engine, &metrics));
    printf("engine: %s\n", metrics);
    CHECK(hs_string_free(metrics));
    /* A request that ended is no longer live. */
    int failed = hs_requests_cancel(engine, 0) != HS_ERR_UNKNOWN_REQUEST;
    CHECK(hs_requests_close(engine));

    failed |= interactive.status != HS_OK || interactive.len == 0;
    failed |= background.status != HS_OK || background.len == 0;
    failed |= cancelled.status != HS_ERR_CANCELLED || !strstr(cancelled.result, "\"cancelled\"");
    failed |= strstr(interactive.result, "ttft_ms") == NULL;
    failed |= example_handles_left();
    if (failed) fprintf(stderr, "requests: an expectation failed\n");
    else printf("requests: 3 requests ended as expected\n");
    return failed;
}
