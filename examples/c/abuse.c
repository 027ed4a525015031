/* Every function of the C ABI called with what a buggy host passes: NULL pointers,
 * live handles of the wrong kind, destroyed handles, integers that are no handle,
 * invalid UTF-8, unknown or twice-reported jobs, a queue callback that fails, a scene
 * that does not load. Each call must return its documented status with a message,
 * never crash; run under AddressSanitizer, nothing may leak or touch freed memory.
 * Exit 0 when every expectation holds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"

static int failures = 0;

static void expect(hs_status got, hs_status want, const char *what, int line) {
    if (got != want) {
        fprintf(stderr, "line %d: %s: got %s, want %s\n", line, what, hs_status_name(got),
                hs_status_name(want));
        failures++;
    } else if (want != HS_OK && hs_last_error() == NULL) {
        fprintf(stderr, "line %d: %s: %s without a message\n", line, what, hs_status_name(got));
        failures++;
    }
}
#define EXPECT(call, want) expect((call), (want), #call, __LINE__)

static const char BAD_UTF8[] = {'s', (char)0xff, (char)0xfe, 0};

static int32_t refuse(const hs_job *job, void *user_data) {
    (void)job;
    (void)user_data;
    return 7;
}

static int cancelled = 0;
static void count_cancel(const hs_job *job, void *user_data) {
    (void)job;
    (void)user_data;
    cancelled++;
}

/* Completes each job at once on the engine's thread, except the ones chosen to fail. */
static hs_engine *sync_engine = NULL;
static int32_t complete_now(const hs_job *job, void *user_data) {
    (void)user_data;
    if (job->id == 0) {
        if (hs_engine_fail(sync_engine, job->id, "\xff not UTF-8") != HS_ERR_INVALID_UTF8) failures++;
        if (hs_engine_fail(sync_engine, job->id, "the host's device was lost") != HS_OK) failures++;
        return 0;
    }
    return hs_engine_complete(sync_engine, job->id, job->dispatched_ns,
                              job->dispatched_ns + job->estimated_ns) == HS_OK ? 0 : 1;
}
static int64_t first_silent_job = -1;
static int32_t never_complete(const hs_job *job, void *user_data) {
    (void)user_data;
    if (first_silent_job < 0) first_silent_job = job->id;
    return 0;
}

int main(void) {
    if (hs_last_error() != NULL) {
        fprintf(stderr, "a fresh thread has a last error\n");
        failures++;
    }
    hs_scene *scene = NULL;
    hs_plan *plan = NULL;
    hs_run *run = NULL;
    hs_engine *engine = NULL;
    char *text = NULL;
    uint64_t number = 0;
    int32_t finished = 0;
    hs_plan_info info;

    /* NULL everywhere. */
    EXPECT(hs_scene_load(NULL, &scene), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_load("qwen-1.8b-sd8gen3", NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_default(NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_from_toml(NULL, "", "", &scene), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_set_device_file(NULL, "x"), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_set_model_file(NULL, "x"), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_set_workload(NULL, 1, 1), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_set_policy(NULL, "stall"), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_name(NULL, &text), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_scene_destroy(NULL), HS_OK);
    EXPECT(hs_policy_names(NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_plan_create(NULL, &plan), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_plan_get_info(NULL, &info), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_plan_destroy(NULL), HS_OK);
    EXPECT(hs_simulate(NULL, NULL, &run), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_run_makespan_ns(NULL, &number), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_run_report_json(NULL, &text), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_run_write_chrome_trace(NULL, "x"), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_run_write_svg(NULL, "x"), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_run_destroy(NULL), HS_OK);
    EXPECT(hs_engine_create(NULL, NULL, HS_CLOCK_VIRTUAL, &engine), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_set_queue(NULL, 0, NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_run(NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_step(NULL, &finished), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_complete(NULL, 0, 0, 1), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_fail(NULL, 0, NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_now_ns(NULL, &number), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_result(NULL, &run), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_cancel(NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_engine_destroy(NULL), HS_OK);
    EXPECT(hs_string_free(NULL), HS_OK);

    /* A scene that does not load; invalid UTF-8; bad TOML. */
    EXPECT(hs_scene_load("/nonexistent/scene.toml", &scene), HS_ERR_LOAD);
    EXPECT(hs_scene_load(BAD_UTF8, &scene), HS_ERR_INVALID_UTF8);
    EXPECT(hs_scene_from_toml("name = [", "", "", &scene), HS_ERR_LOAD);
    EXPECT(hs_scene_from_toml(BAD_UTF8, "", "", &scene), HS_ERR_INVALID_UTF8);
    if (scene != NULL) failures++; /* untouched on failure */

    /* Live handles of each kind. */
    EXPECT(hs_scene_default(&scene), HS_OK);
    EXPECT(hs_scene_set_policy(scene, "no-such-policy"), HS_ERR_UNKNOWN_POLICY);
    EXPECT(hs_scene_set_policy(scene, BAD_UTF8), HS_ERR_INVALID_UTF8);
    EXPECT(hs_scene_set_workload(scene, 0, 256), HS_ERR_INVALID_ARGUMENT);
    EXPECT(hs_scene_set_device_file(scene, "/nonexistent/device.toml"), HS_ERR_LOAD);
    EXPECT(hs_scene_set_model_file(scene, BAD_UTF8), HS_ERR_INVALID_UTF8);
    EXPECT(hs_scene_set_workload(scene, 512, 128), HS_OK);
    EXPECT(hs_plan_create(scene, &plan), HS_OK);
    EXPECT(hs_plan_get_info(plan, &info), HS_OK);
    EXPECT(hs_simulate(plan, "no-such-policy", &run), HS_ERR_UNKNOWN_POLICY);
    EXPECT(hs_simulate(plan, BAD_UTF8, &run), HS_ERR_INVALID_UTF8);
    EXPECT(hs_simulate(plan, "stall", &run), HS_OK);
    EXPECT(hs_run_write_svg(run, "/nonexistent/dir/run.svg"), HS_ERR_IO);
    EXPECT(hs_run_write_chrome_trace(run, BAD_UTF8), HS_ERR_INVALID_UTF8);
    EXPECT(hs_engine_create(plan, NULL, 42, &engine), HS_ERR_INVALID_ARGUMENT);
    EXPECT(hs_engine_create(plan, NULL, HS_CLOCK_VIRTUAL, &engine), HS_OK);

    /* Wrong kinds: every function given a live handle of another kind. */
    EXPECT(hs_scene_set_policy((hs_scene *)plan, "stall"), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_scene_name((hs_scene *)run, &text), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_scene_destroy((hs_scene *)engine), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_plan_create((hs_scene *)plan, &plan), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_plan_get_info((hs_plan *)scene, &info), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_plan_destroy((hs_plan *)run), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_simulate((hs_plan *)scene, NULL, &run), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_run_makespan_ns((hs_run *)plan, &number), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_run_report_json((hs_run *)engine, &text), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_run_destroy((hs_run *)scene), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_engine_create((hs_plan *)engine, NULL, HS_CLOCK_VIRTUAL, &engine), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_engine_run((hs_engine *)plan), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_engine_step((hs_engine *)run, &finished), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_engine_complete((hs_engine *)scene, 0, 0, 1), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_engine_destroy((hs_engine *)plan), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_engine_cancel((hs_engine *)plan), HS_ERR_WRONG_HANDLE_KIND);

    /* Integers that were never handles; a pointer to the host's own memory. */
    EXPECT(hs_plan_get_info((hs_plan *)(uintptr_t)8, &info), HS_ERR_INVALID_HANDLE);
    EXPECT(hs_engine_run((hs_engine *)&info), HS_ERR_INVALID_HANDLE);

    /* Strings: freed once; a foreign pointer is refused, not freed. */
    EXPECT(hs_policy_names(&text), HS_OK);
    if (!text || !strstr(text, "\"stall\"")) failures++;
    EXPECT(hs_string_free(text), HS_OK);
    EXPECT(hs_string_free(text), HS_ERR_INVALID_ARGUMENT);
    char mine[] = "not the library's";
    EXPECT(hs_string_free(mine), HS_ERR_INVALID_ARGUMENT);

    /* Engine misuse: run before queues; bad queues; unknown jobs. */
    EXPECT(hs_engine_run(engine), HS_ERR_STATE);
    hs_queue no_submit = {NULL, NULL, NULL};
    EXPECT(hs_engine_set_queue(engine, 0, &no_submit), HS_ERR_NULL_ARGUMENT);
    hs_queue refusing = {refuse, count_cancel, NULL};
    EXPECT(hs_engine_set_queue(engine, info.processors, &refusing), HS_ERR_INVALID_ARGUMENT);
    EXPECT(hs_engine_complete(engine, 0, 0, 1), HS_ERR_UNKNOWN_JOB);
    EXPECT(hs_engine_complete(engine, 0, 5, 1), HS_ERR_INVALID_ARGUMENT);
    EXPECT(hs_engine_fail(engine, 123456, NULL), HS_ERR_UNKNOWN_JOB);
    EXPECT(hs_engine_result(engine, &run), HS_ERR_STATE);
    EXPECT(hs_engine_step(engine, NULL), HS_ERR_NULL_ARGUMENT);
    /* A queue whose submit fails: the run fails and the other running jobs are cancelled. */
    for (uint32_t p = 0; p < info.processors; p++) EXPECT(hs_engine_set_queue(engine, p, &refusing), HS_OK);
    EXPECT(hs_engine_run(engine), HS_ERR_RUN_FAILED);
    EXPECT(hs_engine_run(engine), HS_ERR_STATE);
    EXPECT(hs_engine_set_queue(engine, 0, &refusing), HS_ERR_STATE);
    EXPECT(hs_engine_destroy(engine), HS_OK);
    /* Destroyed: every later use is refused. */
    EXPECT(hs_engine_destroy(engine), HS_ERR_INVALID_HANDLE);
    EXPECT(hs_engine_complete(engine, 0, 0, 1), HS_ERR_INVALID_HANDLE);
    EXPECT(hs_engine_cancel(engine), HS_ERR_INVALID_HANDLE);

    /* A host failure reported from inside submit: the run fails, the rest is cancelled. */
    EXPECT(hs_engine_create(plan, "inorder", HS_CLOCK_VIRTUAL, &sync_engine), HS_OK);
    hs_queue sync = {complete_now, count_cancel, NULL};
    for (uint32_t p = 0; p < info.processors; p++) EXPECT(hs_engine_set_queue(sync_engine, p, &sync), HS_OK);
    EXPECT(hs_engine_run(sync_engine), HS_ERR_RUN_FAILED);
    if (!hs_last_error() || !strstr(hs_last_error(), "device was lost")) {
        fprintf(stderr, "the host's reason is not in the message: %s\n", hs_last_error());
        failures++;
    }
    EXPECT(hs_engine_complete(sync_engine, 1, 0, 1), HS_ERR_UNKNOWN_JOB);
    EXPECT(hs_engine_destroy(sync_engine), HS_OK);

    /* Stepping a run whose jobs never end returns at once, again and again. */
    EXPECT(hs_engine_create(plan, NULL, HS_CLOCK_VIRTUAL, &engine), HS_OK);
    hs_queue silent = {never_complete, count_cancel, NULL};
    for (uint32_t p = 0; p < info.processors; p++) EXPECT(hs_engine_set_queue(engine, p, &silent), HS_OK);
    for (int i = 0; i < 3; i++) {
        EXPECT(hs_engine_step(engine, &finished), HS_OK);
        if (finished) failures++;
    }
    int before = cancelled;
    uint32_t job = (uint32_t)first_silent_job;
    EXPECT(hs_engine_complete(engine, job, 0, 1), HS_OK);
    EXPECT(hs_engine_complete(engine, job, 0, 1), HS_ERR_UNKNOWN_JOB);
    EXPECT(hs_engine_destroy(engine), HS_OK); /* mid-run: nothing leaks */
    if (cancelled != before) failures++;

    /* The request engine: NULLs, wrong kinds, bad limits and files that are no model
     * (each refused before anything loads or starts). */
    hs_requests *requests = NULL;
    hs_request_options options = {.max_tokens = 4, .top_p = 1.0f};
    hs_requests_limits bad_limits = {.refuse_when_full = 7};
    uint64_t request_id = 0;
    EXPECT(hs_requests_open(NULL, NULL, &requests), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_requests_open("no/such/model.gguf", NULL, NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_requests_open(BAD_UTF8, NULL, &requests), HS_ERR_INVALID_UTF8);
    EXPECT(hs_requests_open("no/such/model.gguf", NULL, &requests), HS_ERR_LOAD);
    EXPECT(hs_requests_open("/proc/self/exe", NULL, &requests), HS_ERR_LOAD);
    EXPECT(hs_requests_open("no/such/model.gguf", &bad_limits, &requests), HS_ERR_INVALID_ARGUMENT);
    if (requests != NULL) failures++;
    EXPECT(hs_requests_submit(NULL, "x", &options, &request_id), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_requests_submit((hs_requests *)plan, "x", &options, &request_id), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_requests_cancel(NULL, 0), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_requests_cancel((hs_requests *)run, 0), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_requests_cancel((hs_requests *)&info, 0), HS_ERR_INVALID_HANDLE);
    EXPECT(hs_requests_metrics_json(NULL, &text), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_requests_metrics_json((hs_requests *)scene, &text), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_requests_close(NULL), HS_OK);
    EXPECT(hs_requests_close((hs_requests *)plan), HS_ERR_WRONG_HANDLE_KIND);

    /* Profiles: NULLs, wrong kinds, a simulated run (its times are predictions), a write
     * with nothing measured, into no folder. */
    hs_profile *profile = NULL;
    EXPECT(hs_profile_create(NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_profile_add_run(NULL, run), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_profile_write(NULL, "/tmp", NULL, NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_profile_destroy(NULL), HS_OK);
    EXPECT(hs_profile_create(&profile), HS_OK);
    EXPECT(hs_profile_add_run(profile, NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_profile_add_run((hs_profile *)run, run), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_profile_add_run(profile, (hs_run *)plan), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_profile_add_run(profile, run), HS_ERR_INVALID_ARGUMENT);
    EXPECT(hs_profile_write(profile, NULL, NULL, NULL), HS_ERR_NULL_ARGUMENT);
    EXPECT(hs_profile_write(profile, BAD_UTF8, NULL, NULL), HS_ERR_INVALID_UTF8);
    EXPECT(hs_profile_write(profile, "/tmp", BAD_UTF8, NULL), HS_ERR_INVALID_UTF8);
    EXPECT(hs_profile_write(profile, "/nonexistent/dir", NULL, NULL), HS_ERR_IO);
    EXPECT(hs_profile_write(profile, "/tmp", NULL, &text), HS_ERR_STATE);
    EXPECT(hs_profile_destroy((hs_profile *)scene), HS_ERR_WRONG_HANDLE_KIND);
    EXPECT(hs_profile_destroy(profile), HS_OK);
    EXPECT(hs_profile_add_run(profile, run), HS_ERR_INVALID_HANDLE);

    EXPECT(hs_run_destroy(run), HS_OK);
    EXPECT(hs_run_destroy(run), HS_ERR_INVALID_HANDLE);
    EXPECT(hs_plan_destroy(plan), HS_OK);
    EXPECT(hs_scene_destroy(scene), HS_OK);
    EXPECT(hs_scene_destroy(scene), HS_ERR_INVALID_HANDLE);
    failures += example_handles_left();
    if (strcmp(hs_status_name(9999), "HS_UNKNOWN_STATUS") != 0) failures++;
    printf("abuse: %d failed expectations\n", failures);
    return failures != 0;
}
