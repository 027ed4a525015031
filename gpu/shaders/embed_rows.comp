#version 450
// Gathers rows of a resident table: out[r] = table[ids[r]] for r < rows (cols a multiple
// of 4). A decode step's embedding: the token id is written by the host into a small
// buffer before each replay of the recorded step. An id past the table writes zeros (the
// host refuses such ids before writing them; this keeps a stray one inside the buffers).
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Table { vec4 table[]; };
layout(std430, binding = 1) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Out { vec4 o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols4;      // columns / 4 (table and out rows, dense)
    uint table_rows;
    uint pad[13];
} p;

void main() {
    uint total = p.rows * p.cols4;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += gl_NumWorkGroups.x * 256) {
        uint r = i / p.cols4;
        uint c = i % p.cols4;
        uint id = ids[r];
        o[i] = id < p.table_rows ? table[id * p.cols4 + c] : vec4(0.0);
    }
}
