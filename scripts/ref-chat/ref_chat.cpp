// ref_chat: llama.cpp's built-in chat formats (llama_chat_apply_template with a template
// *name*, no Jinja), for scripts/gen-builtin-templates.
//
//   ref_chat list                 one built-in name per line
//   ref_chat apply NAME ADD_ASS   stdin: role NUL content NUL ... ; stdout: the prompt,
//                                 or exit 3 when llama.cpp refuses the conversation
#include "llama.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "list") {
        std::vector<const char *> names(256);
        int n = llama_chat_builtin_templates(names.data(), names.size());
        for (int i = 0; i < n && i < (int) names.size(); i++) printf("%s\n", names[i]);
        return 0;
    }
    if (cmd != "apply" || argc != 4) {
        fprintf(stderr, "usage: ref_chat list | apply NAME ADD_ASS < messages\n");
        return 2;
    }
    std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::vector<std::string> fields;
    size_t start = 0;
    for (size_t i = 0; i < in.size(); i++) {
        if (in[i] == '\0') { fields.push_back(in.substr(start, i - start)); start = i + 1; }
    }
    std::vector<llama_chat_message> msgs;
    for (size_t i = 0; i + 1 < fields.size(); i += 2) msgs.push_back({fields[i].c_str(), fields[i + 1].c_str()});
    bool add_ass = std::string(argv[3]) == "1";
    std::vector<char> buf(1 << 16);
    int n = llama_chat_apply_template(argv[2], msgs.data(), msgs.size(), add_ass, buf.data(), buf.size());
    if (n < 0) return 3;
    if (n > (int) buf.size()) {
        buf.resize(n);
        n = llama_chat_apply_template(argv[2], msgs.data(), msgs.size(), add_ass, buf.data(), buf.size());
    }
    fwrite(buf.data(), 1, n, stdout);
    return 0;
}
