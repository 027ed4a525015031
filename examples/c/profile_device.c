/* The phone workflow from C (docs/calibration.md): profile a device through the host's
 * own queues, write the profile, load it as a desktop would and predict workloads the
 * profile never ran, then run those on the device and compare.
 *
 *   profile_device OUTPUT_DIR [SCENE]
 *
 * The device: each processor lane of the scene is a host queue on HS_CLOCK_WALL that
 * reports, for every job, when it started and ended. Here the host stands in for the
 * hardware with a device of known speed, so that the fit can be checked without timing
 * noise: a job on lane p takes SPEED[p] x its modeled time plus LAUNCH_NS, and completes
 * inside submit. A real host runs the job (a QNN graph, an OpenCL kernel) and reports
 * hs_engine_now_ns taken before and after it, from whichever of its threads ran it.
 * (Completing inside submit with times ahead of the clock only suits `inorder`, one job
 * at a time: a real device's overlapped jobs end when they end.)
 *
 * Steps: `inorder` runs over a grid of workloads (jobs one at a time: each a sample of
 * its stage's cost alone); hs_profile_write fits a cost per (processor, precision, stage
 * kind) and writes device.toml, model.toml and scene.toml into OUTPUT_DIR. (On a real
 * device, add one `balance` run of a grid workload: the profile then also measures how
 * two jobs share the processors.) Then only those files: held-out workloads predicted
 * with hs_simulate, and measured on the device. Exit 0 when every prediction is within
 * 5% of its measurement and no handle is left alive. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"

/* The stand-in device: lane p runs SPEED[p % 4] times slower than the scene's model. */
static const double SPEED[4] = {1.5, 0.8, 2.0, 1.2};
static const uint64_t LAUNCH_NS = 20000;

typedef struct lane {
    hs_engine *engine;
    uint32_t processor;
} lane;

/* hs_submit_fn: the job runs and is reported at once. */
static int32_t run_job(const hs_job *job, void *user_data) {
    const lane *self = user_data;
    uint64_t took = (uint64_t)(SPEED[self->processor % 4] * (double)job->estimated_ns) + LAUNCH_NS;
    return hs_engine_complete(self->engine, job->id, job->dispatched_ns,
                              job->dispatched_ns + took) == HS_OK ? 0 : 1;
}

/* Runs the scene's plan for (prompt, chunk) under `policy` on the device: a measured run. */
static hs_run *run_on_device(hs_scene *scene, uint32_t prompt, uint32_t chunk,
                             const char *policy) {
    CHECK(hs_scene_set_workload(scene, prompt, chunk));
    hs_plan *plan = NULL;
    CHECK(hs_plan_create(scene, &plan));
    hs_plan_info info;
    CHECK(hs_plan_get_info(plan, &info));
    hs_engine *engine = NULL;
    CHECK(hs_engine_create(plan, policy, HS_CLOCK_WALL, &engine));
    lane *lanes = calloc(info.processors, sizeof(lane));
    if (!lanes) exit(1);
    for (uint32_t p = 0; p < info.processors; p++) {
        lanes[p] = (lane){engine, p};
        hs_queue queue = {run_job, NULL, &lanes[p]};
        CHECK(hs_engine_set_queue(engine, p, &queue));
    }
    CHECK(hs_engine_run(engine));
    hs_run *run = NULL;
    CHECK(hs_engine_result(engine, &run));
    CHECK(hs_engine_destroy(engine));
    free(lanes);
    CHECK(hs_plan_destroy(plan));
    return run;
}

/* The grid the device profiles, and workloads it never ran. */
static const uint32_t GRID[][2] = {{256, 64}, {256, 128}, {256, 256},
                                   {1024, 64}, {1024, 128}, {1024, 256}};
static const uint32_t HELD_OUT[][2] = {{512, 128}, {1536, 192}, {2048, 96}};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTPUT_DIR [SCENE]\n", argv[0]);
        return 2;
    }
    if (example_abi_mismatch()) return 1;
    const char *dir = argv[1];
    hs_scene *device = NULL;
    if (argc > 2) CHECK(hs_scene_load(argv[2], &device));
    else CHECK(hs_scene_default(&device));

    /* ---- On the device: measure, fit, write ---- */
    hs_profile *profile = NULL;
    CHECK(hs_profile_create(&profile));
    for (size_t i = 0; i < sizeof GRID / sizeof GRID[0]; i++) {
        hs_run *run = run_on_device(device, GRID[i][0], GRID[i][1], "inorder");
        CHECK(hs_profile_add_run(profile, run));
        CHECK(hs_run_destroy(run));
    }
    char *summary = NULL;
    CHECK(hs_profile_write(profile, dir, "the C host's device", &summary));
    printf("device: wrote %s/{device,model,scene}.toml\n  %s\n", dir, summary);
    CHECK(hs_string_free(summary));
    CHECK(hs_profile_destroy(profile));

    /* ---- On the desktop: only the three files ---- */
    char path[4096];
    snprintf(path, sizeof path, "%s/scene.toml", dir);
    hs_scene *carried = NULL;
    CHECK(hs_scene_load(path, &carried));
    int failed = 0;
    printf("prompt chunk  predicted_ms measured_ms error (inorder)\n");
    for (size_t w = 0; w < sizeof HELD_OUT / sizeof HELD_OUT[0]; w++) {
        uint32_t prompt = HELD_OUT[w][0], chunk = HELD_OUT[w][1];
        CHECK(hs_scene_set_workload(carried, prompt, chunk));
        hs_plan *plan = NULL;
        CHECK(hs_plan_create(carried, &plan));
        hs_run *predicted = NULL;
        CHECK(hs_simulate(plan, "inorder", &predicted));
        /* ---- Back on the device: the same workload, for real ---- */
        hs_run *measured = run_on_device(device, prompt, chunk, "inorder");
        uint64_t predicted_ns = 0, measured_ns = 0;
        CHECK(hs_run_makespan_ns(predicted, &predicted_ns));
        CHECK(hs_run_makespan_ns(measured, &measured_ns));
        double error = ((double)predicted_ns - (double)measured_ns) / (double)measured_ns;
        printf("%6u %5u %13.1f %11.1f %+5.1f%%\n", prompt, chunk, predicted_ns / 1e6,
               measured_ns / 1e6, 100 * error);
        failed |= fabs(error) > 0.05;
        CHECK(hs_run_destroy(predicted));
        CHECK(hs_run_destroy(measured));
        CHECK(hs_plan_destroy(plan));
    }
    CHECK(hs_scene_destroy(carried));
    CHECK(hs_scene_destroy(device));
    if (failed) fprintf(stderr, "a prediction is more than 5%% off its measurement\n");
    failed |= example_handles_left();
    if (!failed) printf("profile_device: every held-out workload predicted within 5%%\n");
    return failed;
}
