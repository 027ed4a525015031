// The C++ wrapper (hetsched.hpp): simulate the default scene under two policies, run it
// on a synchronous host queue in virtual time (each job completes inside submit), check
// that the hosted schedule equals the simulated one and that errors throw; then profile
// the queue on the wall clock (hetsched::Profile) and load the profile it wrote.
//
//   simulate_cpp [OUTPUT_DIR]   (writes run.trace.json, run.svg and the profile's
//                                device.toml, model.toml, scene.toml there if given)
#include <cstdio>
#include <string>
#include <vector>

#include "hetsched.hpp"

namespace {
struct SyncQueue {
    const hetsched::Engine *engine = nullptr;
    static std::int32_t submit(const hs_job *job, void *user_data) {
        auto *self = static_cast<SyncQueue *>(user_data);
        try {
            self->engine->complete(job->id, job->dispatched_ns, job->dispatched_ns + job->estimated_ns);
            return 0;
        } catch (const hetsched::Error &) {
            return 1; // never let an exception cross the C boundary
        }
    }
};
} // namespace

int main(int argc, char **argv) {
    try {
        hetsched::Scene scene;
        std::printf("scene %s\n", scene.name().c_str());
        hetsched::Plan plan = scene.plan();
        hs_plan_info info = plan.info();
        for (const char *policy : {"balance", "inorder"}) {
            hetsched::Run run = plan.simulate(policy);
            std::printf("%-8s makespan %.3f ms (predicted), lower bound %.3f ms\n", policy,
                        run.makespan_ns() / 1e6, info.lower_bound_ns / 1e6);
        }

        hetsched::Engine engine(plan, HS_CLOCK_VIRTUAL);
        std::vector<SyncQueue> queues(info.processors, SyncQueue{&engine});
        for (std::uint32_t p = 0; p < info.processors; p++)
            engine.set_queue(p, hs_queue{SyncQueue::submit, nullptr, &queues[p]});
        engine.run();
        hetsched::Run hosted = engine.result();
        hetsched::Run simulated = plan.simulate();
        if (hosted.makespan_ns() != simulated.makespan_ns()) {
            std::fprintf(stderr, "hosted %llu ns != simulated %llu ns\n",
                         (unsigned long long)hosted.makespan_ns(),
                         (unsigned long long)simulated.makespan_ns());
            return 1;
        }
        std::printf("synchronous host queue: %.3f ms, equal to the simulation\n",
                    hosted.makespan_ns() / 1e6);
        if (argc > 1) {
            std::string dir = argv[1];
            hosted.write_chrome_trace(dir + "/run.trace.json");
            hosted.write_svg(dir + "/run.svg");
        }

        // A profile takes measured runs only: a virtual-clock run is refused.
        hetsched::Profile profile;
        try {
            profile.add_run(hosted);
            std::fprintf(stderr, "a virtual-clock run was taken as measured\n");
            return 1;
        } catch (const hetsched::Error &e) {
            if (e.status() != HS_ERR_INVALID_ARGUMENT) return 1;
        }
        // Three wall-clock runs under inorder (the queue reports each job as taking its
        // modeled time from its dispatch), fitted and written, then loaded as a scene.
        for (std::uint32_t chunk : {64u, 128u, 256u}) {
            scene.set_workload(256, chunk);
            hetsched::Plan profiled = scene.plan();
            hetsched::Engine wall(profiled, HS_CLOCK_WALL, "inorder");
            std::vector<SyncQueue> lanes(info.processors, SyncQueue{&wall});
            for (std::uint32_t p = 0; p < info.processors; p++)
                wall.set_queue(p, hs_queue{SyncQueue::submit, nullptr, &lanes[p]});
            wall.run();
            profile.add_run(wall.result());
        }
        if (argc > 1) {
            std::string summary = profile.write(argv[1], "the C++ host's queue");
            std::printf("profile: %.120s...\n", summary.c_str());
            hetsched::Scene carried(std::string(argv[1]) + "/scene.toml");
            std::printf("loaded `%s`: inorder predicted %.3f ms\n", carried.name().c_str(),
                        carried.plan().simulate("inorder").makespan_ns() / 1e6);
        }

        try {
            scene.set_policy("no-such-policy");
            std::fprintf(stderr, "an unknown policy did not throw\n");
            return 1;
        } catch (const hetsched::Error &e) {
            if (e.status() != HS_ERR_UNKNOWN_POLICY) return 1;
            std::printf("unknown policy throws: %s\n", e.what());
        }
    } catch (const hetsched::Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    if (hs_live_handles() != 0) {
        std::fprintf(stderr, "%zu handles left alive\n", hs_live_handles());
        return 1;
    }
    return 0;
}
