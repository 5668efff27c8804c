/* The eval callback that copies a llama.cpp forward's layer taps for verispec's heads.
 *
 * llama.cpp asks its eval callback about every node of a forward's graph (936 for the default
 * model) before computing it. Answered in Python, the asking alone costs about 0.9 ms a token.
 * This callback compares the node's name with the wanted ones in C and calls back into Python
 * only for the wanted nodes, once each is computed, to copy its rows. */
#include <stdbool.h>
#include <string.h>

struct ggml_tensor;

#define VERISPEC_MAX_TAPS 64
#define VERISPEC_NAME_BYTES 64 /* ggml's GGML_MAX_NAME */

struct verispec_taps {
    const char * (*name)(const struct ggml_tensor *); /* ggml_get_name */
    bool (*copy)(struct ggml_tensor *);               /* copies a computed tap's rows; true to go on */
    int count;
    char names[VERISPEC_MAX_TAPS][VERISPEC_NAME_BYTES];
};

bool verispec_observe(struct ggml_tensor * tensor, bool ask, void * user_data) {
    const struct verispec_taps * taps = user_data;
    const char * name = taps->name(tensor);
    for (int i = 0; i < taps->count; i++) {
        if (strncmp(name, taps->names[i], VERISPEC_NAME_BYTES) == 0) {
            return ask ? true : taps->copy(tensor);
        }
    }
    return false;
}
