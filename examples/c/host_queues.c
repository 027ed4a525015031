/* A C host running a scene's jobs on its own queues: one pthread per processor lane.
 *
 * The engine calls `submit` on the thread that drives it; the lane's thread runs the
 * job (here: sleeps for a scaled share of its modeled time) and reports the end with
 * hs_engine_complete from that thread. Afterwards the schedule is compared with the
 * library's own simulation of the same plan.
 *
 *   host_queues [--wall] [--step] [--cancel-after N] [--json-out FILE] [--trace FILE]
 *               [--svg FILE] [SCENE]
 *
 * Default: HS_CLOCK_VIRTUAL, the jobs report their modeled times, and the run must equal
 * the simulation (makespan and report; exit 1 otherwise). --wall: jobs sleep
 * modeled / 1000 and report wall-clock times; the measured makespan is printed beside
 * the prediction. --step: the main thread drives the engine with hs_engine_step from its
 * own event loop instead of the blocking hs_engine_run. --cancel-after N: the lane thread
 * that reports the N-th job cancels the run with hs_engine_cancel; the run must end with
 * HS_ERR_CANCELLED after every job it dispatched was reported, and have no result. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "example.h"

/* The main thread's event loop (--step) sleeps on this until some lane reports. */
static pthread_mutex_t loop_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t loop_wake = PTHREAD_COND_INITIALIZER;
static unsigned loop_reports = 0;

/* --cancel-after: jobs reported so far (all lanes), and the report that cancels. */
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned reported = 0, submitted = 0;
static unsigned cancel_after = 0;

typedef struct lane {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    hs_job job;  /* the job to run (the scheduler gives a lane one job at a time) */
    int has_job;
    int quit;
    int wall;
    hs_engine *engine;
} lane;

static void sleep_ns(uint64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&t, NULL);
}

static void *lane_main(void *arg) {
    lane *self = arg;
    for (;;) {
        pthread_mutex_lock(&self->lock);
        while (!self->has_job && !self->quit) pthread_cond_wait(&self->wake, &self->lock);
        if (!self->has_job) {
            pthread_mutex_unlock(&self->lock);
            return NULL;
        }
        hs_job job = self->job;
        self->has_job = 0;
        pthread_mutex_unlock(&self->lock);

        if (self->wall) {
            uint64_t start = 0, end = 0;
            CHECK(hs_engine_now_ns(self->engine, &start));
            sleep_ns(job.estimated_ns / 1000); /* the real work: modeled time, scaled */
            CHECK(hs_engine_now_ns(self->engine, &end));
            CHECK(hs_engine_complete(self->engine, job.id, start, end));
        } else {
            /* Virtual time: the job starts when dispatched and takes its modeled time. */
            CHECK(hs_engine_complete(self->engine, job.id, job.dispatched_ns,
                                     job.dispatched_ns + job.estimated_ns));
        }
        pthread_mutex_lock(&count_lock);
        int cancel_now = ++reported == cancel_after;
        pthread_mutex_unlock(&count_lock);
        /* From a host thread, while the engine's thread drives the run. */
        if (cancel_now) CHECK(hs_engine_cancel(self->engine));
        pthread_mutex_lock(&loop_lock);
        loop_reports++;
        pthread_cond_signal(&loop_wake);
        pthread_mutex_unlock(&loop_lock);
    }
}

/* hs_submit_fn: hand the job to the lane's thread. */
static int32_t submit(const hs_job *job, void *user_data) {
    lane *self = user_data;
    pthread_mutex_lock(&self->lock);
    int busy = self->has_job;
    if (!busy) {
        pthread_mutex_lock(&count_lock);
        submitted++;
        pthread_mutex_unlock(&count_lock);
        self->job = *job;
        self->has_job = 1;
        pthread_cond_signal(&self->wake);
    }
    pthread_mutex_unlock(&self->lock);
    return busy ? -1 : 0; /* a second job on a busy lane would break the contract */
}

/* hs_cancel_fn: the run failed; drop the job if it has not started. */
static void cancel(const hs_job *job, void *user_data) {
    lane *self = user_data;
    pthread_mutex_lock(&self->lock);
    if (self->has_job && self->job.id == job->id) self->has_job = 0;
    pthread_mutex_unlock(&self->lock);
}

int main(int argc, char **argv) {
    int wall = 0, step = 0;
    const char *json_out = NULL, *trace = NULL, *svg = NULL, *scene_name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wall")) wall = 1;
        else if (!strcmp(argv[i], "--step")) step = 1;
        else if (!strcmp(argv[i], "--cancel-after") && i + 1 < argc) cancel_after = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json-out") && i + 1 < argc) json_out = argv[++i];
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
        else if (!strcmp(argv[i], "--svg") && i + 1 < argc) svg = argv[++i];
        else scene_name = argv[i];
    }
    if (example_abi_mismatch()) return 1;

    hs_scene *scene = NULL;
    if (scene_name) CHECK(hs_scene_load(scene_name, &scene));
    else CHECK(hs_scene_default(&scene));
    hs_plan *plan = NULL;
    CHECK(hs_plan_create(scene, &plan));
    hs_plan_info info;
    CHECK(hs_plan_get_info(plan, &info));

    hs_engine *engine = NULL;
    CHECK(hs_engine_create(plan, NULL, wall ? HS_CLOCK_WALL : HS_CLOCK_VIRTUAL, &engine));
    lane *lanes = calloc(info.processors, sizeof(lane));
    if (!lanes) return 1;
    for (uint32_t p = 0; p < info.processors; p++) {
        lane *l = &lanes[p];
        pthread_mutex_init(&l->lock, NULL);
        pthread_cond_init(&l->wake, NULL);
        l->wall = wall;
        l->engine = engine;
        pthread_create(&l->thread, NULL, lane_main, l);
        hs_queue queue = {submit, cancel, l};
        CHECK(hs_engine_set_queue(engine, p, &queue));
    }

    hs_status ended = HS_OK;
    if (step) {
        /* The host's own event loop: step, then sleep until a lane reports. */
        int32_t finished = 0;
        unsigned seen = 0;
        for (;;) {
            ended = hs_engine_step(engine, &finished);
            if (ended != HS_OK || finished) break;
            pthread_mutex_lock(&loop_lock);
            while (loop_reports == seen) pthread_cond_wait(&loop_wake, &loop_lock);
            seen = loop_reports;
            pthread_mutex_unlock(&loop_lock);
        }
    } else {
        ended = hs_engine_run(engine);
    }
    if (ended != HS_OK && !(cancel_after && ended == HS_ERR_CANCELLED)) CHECK(ended);
    if (cancel_after && ended != HS_ERR_CANCELLED) {
        fprintf(stderr, "the run ended with %s, not cancelled\n", hs_status_name(ended));
        return 1;
    }
    const char *why = ended == HS_OK ? NULL : hs_last_error();
    char why_copy[256] = "";
    if (why) snprintf(why_copy, sizeof why_copy, "%s", why);

    for (uint32_t p = 0; p < info.processors; p++) {
        pthread_mutex_lock(&lanes[p].lock);
        lanes[p].quit = 1;
        pthread_cond_signal(&lanes[p].wake);
        pthread_mutex_unlock(&lanes[p].lock);
        pthread_join(lanes[p].thread, NULL);
        pthread_mutex_destroy(&lanes[p].lock);
        pthread_cond_destroy(&lanes[p].wake);
    }
    free(lanes);

    if (cancel_after) {
        /* Every job dispatched was reported (the run drained them), and it has no result. */
        hs_run *none = NULL;
        int failed = submitted != reported || submitted < cancel_after ||
                     hs_engine_result(engine, &none) != HS_ERR_STATE;
        printf("cancelled after %u of %u jobs reported (%u dispatched): %s\n", cancel_after,
               info.instances, submitted, why_copy);
        if (failed) fprintf(stderr, "%u jobs dispatched, %u reported\n", submitted, reported);
        CHECK(hs_engine_destroy(engine));
        CHECK(hs_plan_destroy(plan));
        CHECK(hs_scene_destroy(scene));
        return failed | example_handles_left();
    }

    hs_run *hosted = NULL, *simulated = NULL;
    CHECK(hs_engine_result(engine, &hosted));
    CHECK(hs_simulate(plan, NULL, &simulated));
    uint64_t hosted_ns = 0, simulated_ns = 0;
    CHECK(hs_run_makespan_ns(hosted, &hosted_ns));
    CHECK(hs_run_makespan_ns(simulated, &simulated_ns));
    printf("%u jobs on %u host queues (%s clock, %s): makespan %.3f ms, simulated %.3f ms\n",
           info.instances, info.processors, wall ? "wall" : "virtual", step ? "stepped" : "blocking",
           hosted_ns / 1e6, simulated_ns / 1e6);
    int failed = !wall && hosted_ns != simulated_ns;
    if (failed) fprintf(stderr, "the hosted schedule differs from the simulation\n");

    if (json_out) {
        char *json = NULL;
        CHECK(hs_run_report_json(hosted, &json));
        FILE *f = fopen(json_out, "w");
        if (!f || fputs(json, f) < 0 || fclose(f) != 0) failed = 1;
        CHECK(hs_string_free(json));
    }
    if (trace) CHECK(hs_run_write_chrome_trace(hosted, trace));
    if (svg) CHECK(hs_run_write_svg(hosted, svg));

    CHECK(hs_run_destroy(hosted));
    CHECK(hs_run_destroy(simulated));
    CHECK(hs_engine_destroy(engine));
    CHECK(hs_plan_destroy(plan));
    CHECK(hs_scene_destroy(scene));
    failed |= example_handles_left();
    return failed;
}
